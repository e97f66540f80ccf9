//! [`Emission`]: how each of DataFusion's join types runs on the streaming hash join — what a
//! probe row adds to the output, and which build rows come out once every probe row has been
//! seen.
//!
//! | join type | each probe row emits                 | build rows emitted at the end |
//! | --------- | ------------------------------------ | ----------------------------- |
//! | Inner     | its pairs                            | none                          |
//! | Left      | its pairs (marking build rows)       | those never matched           |
//! | Right     | its pairs, or itself alone           | none                          |
//! | Full      | its pairs, or itself alone (marking) | those never matched           |
//! | LeftSemi  | nothing (marking)                    | those matched                 |
//! | LeftAnti  | nothing (marking)                    | those never matched           |
//! | LeftMark  | nothing (marking)                    | all, with the mark            |
//! | RightSemi | itself if it has a match             | none                          |
//! | RightAnti | itself if it has no match            | none                          |
//! | RightMark | itself, with the mark                | none                          |
//!
//! Here the left input is the build side and the right input the probe side, as in
//! `HashJoinExec`.
//!
//! With a residual filter ([`Emission::filtered`]) the device cannot tell a match, only a
//! candidate pair: every probe row emits its candidate pairs (alone if it has none, where
//! probe rows without a match are kept), and the host decides and marks
//! (`exec::residual`).

use datafusion::logical_expr::JoinType;

use crate::backend::{Keep, ProbeEmit};

/// What a join of one type outputs, on each side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emission {
    /// What each probe row adds to the output.
    pub probe: ProbeEmit,
    /// The build rows output after the last probe row, by whether a probe row matched them;
    /// `None`: none, and build rows need no marking.
    pub build: Option<Keep>,
}

impl Emission {
    /// The emission of `join_type`.
    pub fn of(join_type: JoinType) -> Self {
        use JoinType::*;
        let (probe, build) = match join_type {
            Inner => (ProbeEmit::Pairs, None),
            Left => (ProbeEmit::Pairs, Some(Keep::Unset)),
            Right => (ProbeEmit::PairsOrAlone, None),
            Full => (ProbeEmit::PairsOrAlone, Some(Keep::Unset)),
            LeftSemi => (ProbeEmit::Nothing, Some(Keep::Set)),
            LeftAnti => (ProbeEmit::Nothing, Some(Keep::Unset)),
            LeftMark => (ProbeEmit::Nothing, Some(Keep::All)),
            RightSemi => (ProbeEmit::Matched, None),
            RightAnti => (ProbeEmit::Unmatched, None),
            RightMark => (ProbeEmit::Every, None),
        };
        Self { probe, build }
    }

    /// The emission of `join_type` with a residual filter: candidates, not matches.
    pub fn filtered(join_type: JoinType) -> Self {
        use JoinType::*;
        let probe = match join_type {
            Inner | Left | LeftSemi | LeftAnti | LeftMark => ProbeEmit::Pairs,
            Right | Full | RightSemi | RightAnti | RightMark => ProbeEmit::PairsOrAlone,
        };
        Self {
            probe,
            build: Self::of(join_type).build,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_rows_are_marked_only_where_every_match_is_visited() {
        use JoinType::*;
        for t in [
            Inner, Left, Right, Full, LeftSemi, LeftAnti, LeftMark, RightSemi, RightAnti, RightMark,
        ] {
            let e = Emission::of(t);
            assert!(e.build.is_none() || e.probe.visits_all(), "{t}");
        }
    }
}
