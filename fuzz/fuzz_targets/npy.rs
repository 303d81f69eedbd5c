//! `.npy` reading: any bytes give a float32 array whose length matches its shape, or an error;
//! header lengths and shapes are checked before anything is allocated.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((shape, values)) = attnc::npy::read_f32(data, 1 << 16) {
        let len: u64 = shape.iter().product();
        assert_eq!(values.len() as u64, len);
        let _ = attnc::npy::check_finite("x", &values, 1, 1);
    }
});
