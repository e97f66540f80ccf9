//! [`Devices`]: the GPUs one join spreads its probe partitions over, a set of device ordinals
//! (`gpu_join.devices`), and [`device_count`], how many this machine has.

use std::fmt;
use std::str::FromStr;

use cudarc::driver::CudaContext;
use datafusion::common::{DataFusionError, Result, config_err};

use super::context::probe_cuda;
use super::memory::driver_error;

/// A non-empty set of device ordinals below [`Devices::MAX`], in ascending order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Devices(u64);

impl Devices {
    /// Ordinals a set can hold: 0 to 63.
    pub const MAX: usize = 64;

    /// The set of device 0.
    pub const ZERO: Self = Self(1);

    /// The set of one device.
    pub fn one(ordinal: usize) -> Result<Self> {
        Self::of([ordinal])
    }

    /// The set of `ordinals`, which must not be empty.
    pub fn of(ordinals: impl IntoIterator<Item = usize>) -> Result<Self> {
        let mut bits = 0u64;
        for o in ordinals {
            if o >= Self::MAX {
                return config_err!("device ordinal {o} is not below {}", Self::MAX);
            }
            bits |= 1 << o;
        }
        match bits {
            0 => config_err!("a set of devices needs at least one"),
            bits => Ok(Self(bits)),
        }
    }

    /// The devices, in ascending order.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        (0..Self::MAX).filter(move |&o| self.0 & (1 << o) != 0)
    }

    /// The lowest ordinal.
    pub fn first(self) -> usize {
        self.0.trailing_zeros() as usize
    }

    /// How many devices the set holds.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Always `false`: a set holds at least one device.
    pub fn is_empty(self) -> bool {
        false
    }

    /// The first `n` devices (at least one).
    pub fn first_n(self, n: usize) -> Self {
        Self(
            self.iter()
                .take(n.max(1))
                .fold(0, |bits, o| bits | (1u64 << o)),
        )
    }
}

impl fmt::Display for Devices {
    /// `0`, or `0,1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = self.iter().map(|o| o.to_string()).collect::<Vec<_>>();
        f.write_str(&list.join(","))
    }
}

impl FromStr for Devices {
    type Err = DataFusionError;

    /// A comma-separated list of ordinals: `0`, `0,1`, `1, 0`.
    fn from_str(s: &str) -> Result<Self> {
        let ordinals = s
            .split(',')
            .map(|o| o.trim().parse::<usize>())
            .collect::<std::result::Result<Vec<_>, _>>();
        match ordinals {
            Ok(o) => Self::of(o),
            Err(_) => config_err!("a list of device ordinals looks like 0,1, not '{s}'"),
        }
    }
}

/// How many CUDA devices the driver reports (an error where there is no driver).
pub fn device_count() -> Result<usize> {
    probe_cuda()?;
    let count = CudaContext::device_count().map_err(|e| driver_error(e, "count devices"))?;
    Ok(count.max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_parse_show_and_take_their_first_devices() {
        let d: Devices = "1, 0,3".parse().unwrap();
        assert_eq!(d.to_string(), "0,1,3");
        assert_eq!((d.first(), d.len()), (0, 3));
        assert_eq!(d.first_n(2).to_string(), "0,1");
        assert_eq!(d.first_n(0).to_string(), "0");
        assert_eq!(d.first_n(9), d);
        assert_eq!(Devices::one(5).unwrap().to_string(), "5");
        for bad in ["", "x", "0,,1", "64", "-1"] {
            assert!(bad.parse::<Devices>().is_err(), "{bad}");
        }
        assert!(Devices::of([]).is_err());
    }
}
