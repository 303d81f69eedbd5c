//! `.npy` tensors: float32, C order, shape checked against the layer, every size in the header
//! checked against the bytes actually there before anything is allocated.

use crate::limits::MAX_NPY_HEADER_BYTES;
use npyz::WriterBuilder;

/// Reads a float32 C-order array; returns its shape and data. `max_elems` bounds the element
/// count before the data is decoded (the caller knows how many the layer needs).
pub fn read_f32(bytes: &[u8], max_elems: u64) -> Result<(Vec<u64>, Vec<f32>), String> {
    let data_start = check_header_len(bytes)?;
    check_header_shape(&bytes[..data_start])?;
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
    let len = shape
        .iter()
        .try_fold(1u64, |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| format!("shape {shape:?} has more elements than can be counted"))?;
    if len > max_elems {
        return Err(format!(
            "shape {shape:?} holds {len} elements, more than the {max_elems} the layer takes"
        ));
    }
    let have = (bytes.len() - data_start) as u64;
    if have != len * 4 {
        return Err(format!(
            "shape {shape:?} needs {} bytes of data, the file holds {have} (truncated or padded file?)",
            len * 4
        ));
    }
    let data: Vec<f32> = file
        .into_vec()
        .map_err(|e| format!("cannot read the data ({e}); is the file truncated?"))?;
    if data.len() as u64 != len {
        return Err(format!(
            "file holds {} of {len} elements (truncated)",
            data.len()
        ));
    }
    Ok((shape, data))
}

/// Where the data starts, from the magic, version and header length, checked against the file
/// size and [`MAX_NPY_HEADER_BYTES`] before the header is parsed.
pub fn check_header_len(bytes: &[u8]) -> Result<usize, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a valid .npy file: missing the \\x93NUMPY magic".into());
    }
    let (len, fixed) = match bytes[6] {
        1 => (u64::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10u64),
        2 | 3 => {
            let Some(b) = bytes.get(8..12) else {
                return Err("not a valid .npy file: the header is cut off".into());
            };
            (
                u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                12u64,
            )
        }
        v => return Err(format!("not a valid .npy file: unknown format version {v}")),
    };
    if len > MAX_NPY_HEADER_BYTES {
        return Err(format!(
            "the .npy header claims {len} bytes, more than the {MAX_NPY_HEADER_BYTES} accepted"
        ));
    }
    if fixed + len > bytes.len() as u64 {
        return Err(format!(
            "the .npy header claims {len} bytes but the file has only {} after the preamble (truncated file?)",
            bytes.len() as u64 - fixed
        ));
    }
    Ok((fixed + len) as usize)
}

/// Refuses, before the header is parsed, a header that is not one flat dictionary with at most
/// one level of parentheses (the shape tuple). A float32 array's header never has more, and
/// npyz's parser takes time exponential in the nesting of a structured `descr` (a 60-byte header
/// of nested `[` ran for minutes).
fn check_header_shape(header: &[u8]) -> Result<(), String> {
    let mut braces = 0u32;
    let mut parens = 0i32;
    for &b in header {
        match b {
            b'[' => {
                return Err(
                    "the .npy header describes a structured dtype (a list); expected float32 (<f4)"
                        .into(),
                )
            }
            b'{' => braces += 1,
            b'(' => {
                parens += 1;
                if parens > 1 {
                    return Err("the .npy header nests parentheses; expected a shape tuple".into());
                }
            }
            b')' => parens -= 1,
            _ => {}
        }
    }
    if braces > 1 {
        return Err("the .npy header nests dictionaries; expected float32 (<f4)".into());
    }
    Ok(())
}

/// The first element that is NaN or infinite, as a message naming the tensor and its index in
/// `[heads, tokens, dim]`.
pub fn check_finite(name: &str, data: &[f32], tokens: u32, dim: u32) -> Result<(), String> {
    let Some(i) = data.iter().position(|v| !v.is_finite()) else {
        return Ok(());
    };
    let (n, d) = (tokens.max(1) as usize, dim.max(1) as usize);
    let (h, rest) = (i / (n * d), i % (n * d));
    Err(format!(
        "input `{name}` element [{h}, {}, {}] is {}; inputs must be finite numbers",
        rest / d,
        rest % d,
        data[i]
    ))
}

/// Encodes a float32 C-order array.
pub fn write_f32(shape: &[u64], data: &[f32]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    {
        // Writing to memory only fails if npyz rejects the shape; say so rather than panic.
        let fail = |e: std::io::Error| format!("cannot encode a .npy of shape {shape:?}: {e}");
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .shape(shape)
            .writer(&mut out)
            .begin_nd()
            .map_err(fail)?;
        w.extend(data.iter().copied()).map_err(fail)?;
        w.finish().map_err(fail)?;
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_header_length_is_refused_before_parsing() {
        let mut b = b"\x93NUMPY\x02\x00".to_vec();
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        b.extend_from_slice(b"{'descr': '<f4'");
        let e = read_f32(&b, 16).unwrap_err();
        assert!(e.contains("header claims 4294967295 bytes"), "{e}");
    }

    #[test]
    fn round_trip_and_shape_larger_than_data() {
        let bytes = write_f32(&[2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(
            read_f32(&bytes, 4).unwrap(),
            (vec![2, 2], vec![1.0, 2.0, 3.0, 4.0])
        );
        assert!(read_f32(&bytes, 3).unwrap_err().contains("more than the 3"));
        let cut = &bytes[..bytes.len() - 4];
        assert!(read_f32(cut, 4).unwrap_err().contains("needs 16 bytes"));
    }

    #[test]
    fn non_finite_named_with_index() {
        let e = check_finite("v", &[0.0, 1.0, 2.0, f32::NAN], 2, 1).unwrap_err();
        assert_eq!(
            e,
            "input `v` element [1, 1, 0] is NaN; inputs must be finite numbers"
        );
    }
}
