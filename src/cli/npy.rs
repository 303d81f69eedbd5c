//! `.npy` tensors at the CLI edge: float32, C order, shape checked against the layer.

use npyz::WriterBuilder;

/// Reads a float32 C-order array; returns its shape and data.
pub fn read_f32(bytes: &[u8]) -> Result<(Vec<u64>, Vec<f32>), String> {
    let file = npyz::NpyFile::new(bytes).map_err(|e| format!("not a valid .npy file: {e}"))?;
    let dtype = file.dtype();
    let ok = matches!(&dtype, npyz::DType::Plain(ts)
        if ts.type_char() == npyz::TypeChar::Float && ts.size_field() == 4);
    if !ok {
        return Err(format!(
            "dtype is {}, expected float32 (<f4)",
            dtype.descr()
        ));
    }
    if file.order() != npyz::Order::C {
        return Err("array is in Fortran order, expected C order".into());
    }
    let shape = file.shape().to_vec();
    let len = file.len() as usize;
    let data: Vec<f32> = file
        .into_vec()
        .map_err(|e| format!("cannot read the data ({e}); is the file truncated?"))?;
    if data.len() != len {
        return Err(format!(
            "file holds {} of {len} elements (truncated)",
            data.len()
        ));
    }
    Ok((shape, data))
}

/// Encodes a float32 C-order array.
pub fn write_f32(shape: &[u64], data: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .shape(shape)
            .writer(&mut out)
            .begin_nd()
            .expect("writing to memory cannot fail");
        w.extend(data.iter().copied())
            .expect("writing to memory cannot fail");
        w.finish().expect("writing to memory cannot fail");
    }
    out
}

/// Accepts `[heads, tokens, dim]`, or `[tokens, dim]` when there is one head.
pub fn check_shape(
    name: &str,
    shape: &[u64],
    heads: u32,
    tokens: u32,
    dim: u32,
) -> Result<(), String> {
    let full = [u64::from(heads), u64::from(tokens), u64::from(dim)];
    if shape == full || (heads == 1 && shape == &full[1..]) {
        Ok(())
    } else {
        let hint = if heads == 1 {
            format!(" (or [{tokens}, {dim}])")
        } else {
            String::new()
        };
        Err(format!(
            "input `{name}` has shape {shape:?}, the layer needs {full:?}{hint}"
        ))
    }
}
