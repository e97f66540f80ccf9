//! Host twin of `kernels/views.cu`: a build side's string and binary values gathered into a
//! buffer of each output window's own (lengths → scan → copy); values longer than `max_copied`
//! are left to the host's output (not copied, their views' buffer index raised by one).

/// Whether row `i` is valid in the packed bitmap `validity` (every row where there is none).
fn valid(validity: Option<&[u8]>, i: usize) -> bool {
    validity.is_none_or(|v| (v[i >> 3] >> (i & 7)) & 1 != 0)
}

/// The bytes of `view` held out of line and where they start in the data (`data_len` bytes,
/// buffer `b` from `starts[b]`); `None` for an inline value or a view past the data.
fn out_of_line(view: u128, starts: &[u64], data_len: u64) -> Option<(u64, u32)> {
    let len = view as u32;
    let buffer = (view >> 64) as u32 as usize;
    if len <= 12 {
        return None;
    }
    let at = starts.get(buffer)? + (view >> 96) as u32 as u64;
    (at + u64::from(len) <= data_len).then_some((at, len))
}

/// `views.len() + 1` offsets of the views' out-of-line bytes that are copied (values of at most
/// `max_copied` bytes), the last their total.
pub(crate) fn offsets(
    views: &[u128],
    validity: Option<&[u8]>,
    starts: &[u64],
    data_len: u64,
    max_copied: u32,
) -> Vec<u64> {
    let mut out = Vec::with_capacity(views.len() + 1);
    let mut total = 0u64;
    for (i, &v) in views.iter().enumerate() {
        out.push(total);
        if valid(validity, i) && v as u32 <= max_copied {
            total += out_of_line(v, starts, data_len).map_or(0, |(_, len)| u64::from(len));
        }
    }
    out.push(total);
    out
}

/// Copies each view's out-of-line value of at most `max_copied` bytes into `out` at its offset
/// and points the view there (buffer 0); a longer value's view keeps naming its bytes, its
/// buffer index raised by one (0 where it names no buffer).
pub(crate) fn copy(
    views: &mut [u128],
    validity: Option<&[u8]>,
    offsets: &[u64],
    (data, starts): (&[u8], &[u64]),
    max_copied: u32,
    out: &mut [u8],
) {
    for (i, view) in views.iter_mut().enumerate() {
        if !valid(validity, i) {
            *view = 0;
            continue;
        }
        if *view as u32 <= 12 {
            continue;
        }
        if *view as u32 > max_copied {
            let buffer = (*view >> 64) as u32;
            *view = match (buffer as usize) < starts.len() {
                true => *view + (1u128 << 64),
                false => 0,
            };
            continue;
        }
        let to = offsets[i];
        let fits = |len: u32| to + u64::from(len) <= (out.len() as u64).min(u64::from(u32::MAX));
        match out_of_line(*view, starts, data.len() as u64) {
            Some((from, len)) if fits(len) => {
                let (from, to, len) = (from as usize, to as usize, len as usize);
                out[to..to + len].copy_from_slice(&data[from..from + len]);
                let kept = *view & ((1u128 << 64) - 1);
                *view = kept | (u128::from(to as u32) << 96);
            }
            _ => *view = 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(len: u32, buffer: u32, offset: u32) -> u128 {
        u128::from(len) | (u128::from(buffer) << 64) | (u128::from(offset) << 96)
    }

    #[test]
    fn values_are_copied_in_row_order_and_their_views_moved() {
        // Buffer 0: bytes 0..40, buffer 1: 40..100.
        let data: Vec<u8> = (0..100u8).collect();
        let starts = [0u64, 40];
        let inline = 5u128 | (u128::from(u32::from_le_bytes(*b"abcd")) << 32);
        let mut views = vec![
            view(20, 1, 10),
            inline,
            view(13, 0, 2),
            view(30, 1, 50), // past buffer 1's end
            view(14, 0, 20), // a null row
            view(40, 1, 0),  // longer than the device copies
        ];
        let validity = [0b10_1111u8];
        let offsets = offsets(&views, Some(&validity), &starts, data.len() as u64, 30);
        assert_eq!(offsets, vec![0, 20, 20, 33, 33, 33, 33]);
        let mut out = vec![0u8; 33];
        let from = (data.as_slice(), starts.as_slice());
        copy(&mut views, Some(&validity), &offsets, from, 30, &mut out);
        assert_eq!(&out[..20], &data[50..70]);
        assert_eq!(&out[20..], &data[2..15]);
        assert_eq!(
            views,
            vec![
                view(20, 0, 0),
                inline,
                view(13, 0, 20),
                0,
                0,
                view(40, 2, 0)
            ]
        );
        // Room for the first value only: the second's view becomes 0.
        let mut views = vec![view(20, 1, 10), view(13, 0, 2)];
        let offsets = super::offsets(&views, None, &starts, 100, u32::MAX);
        let mut out = vec![0u8; 25];
        copy(&mut views, None, &offsets, from, u32::MAX, &mut out);
        assert_eq!(views, vec![view(20, 0, 0), 0]);
    }
}
