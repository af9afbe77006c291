//! Stop strings matched across token boundaries.
//!
//! Text that could be the start of a stop string is held back until it either
//! completes the stop string (generation ends, the stop text is never emitted)
//! or stops matching (it is released). A stop string can therefore never begin
//! inside text already sent to the client.

#[derive(Debug, Clone, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    /// Generated text not yet released.
    pending: String,
    /// Bytes of generated text pushed so far.
    pushed: usize,
    /// Bytes released so far (always a prefix of what was pushed).
    released: usize,
    stopped: bool,
}

/// What one [`StopFilter::push`] releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Released {
    pub text: String,
    /// A stop string was completed: generation must end; `text` is the last of it.
    pub stopped: bool,
}

impl StopFilter {
    pub fn new(stops: Vec<String>) -> Self {
        StopFilter { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), ..Default::default() }
    }

    /// Bytes of generated text pushed so far.
    pub fn pushed(&self) -> usize {
        self.pushed
    }

    /// Bytes released so far. After a stop, this is where the output was cut.
    pub fn released(&self) -> usize {
        self.released
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Add generated text; returns what can be sent now.
    pub fn push(&mut self, piece: &str) -> Released {
        if self.stopped {
            return Released { text: String::new(), stopped: true };
        }
        self.pushed += piece.len();
        self.pending.push_str(piece);
        if self.stops.is_empty() {
            return self.release(self.pending.len(), false);
        }
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            self.stopped = true;
            let r = self.release(at, true);
            self.pending.clear();
            return r;
        }
        let keep = self.held_suffix();
        self.release(self.pending.len() - keep, false)
    }

    /// The end of generation: release whatever is held back.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        self.release(self.pending.len(), false).text
    }

    fn release(&mut self, n: usize, stopped: bool) -> Released {
        let rest = self.pending.split_off(n);
        let text = std::mem::replace(&mut self.pending, rest);
        self.released += text.len();
        Released { text, stopped }
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn held_suffix(&self) -> usize {
        let p = &self.pending;
        for (i, _) in p.char_indices() {
            let tail = &p[i..];
            if self.stops.iter().any(|s| s.len() > tail.len() && s.starts_with(tail)) {
                return tail.len();
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut f = StopFilter::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = f.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&f.finish());
        (out, false)
    }

    #[test]
    fn no_stops_passes_everything() {
        assert_eq!(run(&[], &["a", "b", "c"]), ("abc".into(), false));
    }

    #[test]
    fn stop_across_tokens_is_cut_and_not_leaked() {
        assert_eq!(run(&["END"], &["hello E", "N", "D more"]), ("hello ".into(), true));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn partial_match_is_released_when_it_fails() {
        let mut f = StopFilter::new(vec!["STOP".into()]);
        assert_eq!(f.push("ab ST").text, "ab ");
        assert_eq!(f.push("Ox").text, "STOx");
        assert_eq!(f.finish(), "");
        assert_eq!(run(&["STOP"], &["ab ST"]), ("ab ST".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true));
        assert_eq!(run(&["xyz", "yq"], &["0xy", "q"]), ("0x".into(), true));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "!x"]), ("caf".into(), true));
        assert_eq!(run(&["éa"], &["cé", "b"]), ("céb".into(), false));
    }

    #[test]
    fn offsets_track_released_bytes() {
        let mut f = StopFilter::new(vec!["##".into()]);
        f.push("ab#");
        assert_eq!((f.pushed(), f.released()), (3, 2));
        let r = f.push("#c");
        assert!(r.stopped);
        assert_eq!(f.released(), 2);
    }
}
