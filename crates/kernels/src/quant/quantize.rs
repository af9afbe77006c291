//! f32 → block format quantizers (for writing support models and for tests).

use tandem_gguf::GgmlType;

fn put_f16(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}

/// Quantize a row (length a multiple of the block size) into `ty`.
/// Supported targets: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.
pub fn quantize_row(ty: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(ty.row_bytes(x.len() as u64)? as usize);
    match ty {
        GgmlType::F32 => x.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        GgmlType::F16 => x.iter().for_each(|&v| put_f16(&mut out, v)),
        GgmlType::BF16 => x.iter().for_each(|&v| {
            // round to nearest even
            let b = v.to_bits();
            let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1));
            out.extend_from_slice(&((r >> 16) as u16).to_le_bytes())
        }),
        GgmlType::Q8_0 => {
            for xs in x.chunks_exact(32) {
                let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(&mut out, d);
                xs.iter().for_each(|&v| out.push((v * id).round().clamp(-127.0, 127.0) as i8 as u8));
            }
        }
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let (levels, off) = if ty == GgmlType::Q4_0 { (8.0, 8.0) } else { (16.0, 16.0) };
            let maxq = 2.0 * off - 1.0;
            for xs in x.chunks_exact(32) {
                // signed max-magnitude scale, as the reference quantizers do
                let mut m = 0f32;
                for &v in xs {
                    if v.abs() > m.abs() {
                        m = v;
                    }
                }
                let d = m / -levels;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let q: Vec<u8> = xs.iter().map(|&v| ((v * id + off + 0.5) as i32).clamp(0, maxq as i32) as u8).collect();
                put_f16(&mut out, d);
                pack_q4_q5(&mut out, &q, ty == GgmlType::Q5_0);
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let maxq = if ty == GgmlType::Q4_1 { 15.0 } else { 31.0 };
            for xs in x.chunks_exact(32) {
                let mn = xs.iter().fold(f32::INFINITY, |a, &v| a.min(v));
                let mx = xs.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
                let d = (mx - mn) / maxq;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let q: Vec<u8> = xs.iter().map(|&v| (((v - mn) * id + 0.5) as i32).clamp(0, maxq as i32) as u8).collect();
                put_f16(&mut out, d);
                put_f16(&mut out, mn);
                pack_q4_q5(&mut out, &q, ty == GgmlType::Q5_1);
            }
        }
        _ => return None,
    }
    Some(out)
}

/// Append 32 values (0..=31) in the Q4/Q5 layout: for 5-bit formats a u32 of
/// fifth bits first, then 16 bytes of nibbles (element j low, j + 16 high).
fn pack_q4_q5(out: &mut Vec<u8>, q: &[u8], five_bit: bool) {
    if five_bit {
        let qh = q.iter().enumerate().fold(0u32, |h, (j, &v)| h | ((((v >> 4) & 1) as u32) << j));
        out.extend_from_slice(&qh.to_le_bytes());
    }
    for j in 0..16 {
        out.push((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    }
}
