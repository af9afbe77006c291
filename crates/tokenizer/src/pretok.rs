//! Pre-tokenization: splitting text into words before BPE.
//!
//! Hand-written instead of a regex because the GPT-2 pattern needs a lookahead
//! (`\s+(?!\S)`) and because llama.cpp itself uses a hand-written matcher whose
//! exact behaviour (e.g. at segment edges) we must reproduce.

use crate::unicode::{class, LETTER, NUMBER, SPACE};

/// The pre-tokenizers we implement, named after `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreTokenizer {
    /// `gpt-2`: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// `smollm`: first every `\p{N}` code point on its own, then GPT-2 on the rest.
    SmolLm,
    /// `qwen2`: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Qwen2,
}

impl PreTokenizer {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name {
            "gpt-2" => Some(Self::Gpt2),
            "smollm" => Some(Self::SmolLm),
            "qwen2" => Some(Self::Qwen2),
            _ => None,
        }
    }

    /// Splits `text` into words, appending their byte ranges to `out`.
    /// The ranges tile `text` exactly.
    pub(crate) fn split(self, text: &str, out: &mut Vec<(usize, usize)>) {
        if text.is_empty() {
            return;
        }
        let mut offs: Vec<usize> = Vec::with_capacity(text.len() + 1);
        let mut cps: Vec<char> = Vec::with_capacity(text.len());
        let mut cls: Vec<u8> = Vec::with_capacity(text.len());
        for (i, c) in text.char_indices() {
            offs.push(i);
            cps.push(c);
            cls.push(class(c));
        }
        offs.push(text.len());

        let mut bounds: Vec<usize> = Vec::with_capacity(cps.len() / 2 + 2);
        match self {
            Self::Gpt2 => gpt2_split(&cps, &cls, 0, cps.len(), &mut bounds),
            Self::Qwen2 => qwen2_split(&cps, &cls, &mut bounds),
            Self::SmolLm => {
                // Every number code point is a segment of its own; the GPT-2
                // rules then run inside each segment and never across one.
                let mut seg_start = 0;
                for i in 0..cps.len() {
                    if cls[i] & NUMBER != 0 {
                        if seg_start < i {
                            gpt2_split(&cps, &cls, seg_start, i, &mut bounds);
                        }
                        bounds.push(i + 1);
                        seg_start = i + 1;
                    }
                }
                if seg_start < cps.len() {
                    gpt2_split(&cps, &cls, seg_start, cps.len(), &mut bounds);
                }
            }
        }

        let mut prev = 0;
        for b in bounds {
            out.push((offs[prev], offs[b]));
            prev = b;
        }
    }
}

/// GPT-2 word splitting of code points `[start, end)`, pushing the end index of
/// each word to `bounds`. Nothing outside the segment is looked at: the
/// lookahead `(?!\S)` sees the segment end as "no character".
fn gpt2_split(cps: &[char], cls: &[u8], start: usize, end: usize, bounds: &mut Vec<usize>) {
    // Class of position `p`, or None past the segment end.
    let class_at = |p: usize| -> Option<u8> {
        if p < end {
            Some(cls[p])
        } else {
            None
        }
    };
    let is = |p: usize, bit: u8| class_at(p).is_some_and(|c| c & bit != 0);

    let mut pos = start;
    while pos < end {
        let c = cps[pos];

        // 's|'t|'re|'ve|'m|'ll|'d
        if c == '\'' && pos + 1 < end {
            let c1 = cps[pos + 1];
            if matches!(c1, 's' | 't' | 'm' | 'd') {
                pos += 2;
                bounds.push(pos);
                continue;
            }
            if pos + 2 < end {
                let c2 = cps[pos + 2];
                if matches!((c1, c2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += 3;
                    bounds.push(pos);
                    continue;
                }
            }
        }

        // An optional leading space joins the run that follows it.
        let lead = pos + usize::from(c == ' ');
        match class_at(lead) {
            // ` ?\p{L}+` and ` ?\p{N}+`
            Some(k) if k & (LETTER | NUMBER) != 0 => {
                let bit = if k & LETTER != 0 { LETTER } else { NUMBER };
                pos = lead;
                while is(pos, bit) {
                    pos += 1;
                }
                bounds.push(pos);
                continue;
            }
            // ` ?[^\s\p{L}\p{N}]+`
            Some(0) => {
                pos = lead;
                while class_at(pos) == Some(0) {
                    pos += 1;
                }
                bounds.push(pos);
                continue;
            }
            _ => {}
        }

        let mut n_space = 0;
        while is(pos + n_space, SPACE) {
            n_space += 1;
        }
        pos = space_run_end(pos, n_space, end);
        bounds.push(pos);
    }
}

/// Where the word starting at `pos` with a whitespace run of `n_space` code
/// points ends under `\s+(?!\S)|\s+`, or after the one code point that no
/// alternative matched when `n_space` is 0.
fn space_run_end(pos: usize, n_space: usize, end: usize) -> usize {
    if n_space > 1 && pos + n_space < end {
        // `\s+(?!\S)`: leave the last space to prefix the next word.
        pos + n_space - 1
    } else if n_space > 0 {
        // `\s+`
        pos + n_space
    } else {
        pos + 1
    }
}

/// Qwen2 word splitting of all code points, pushing the end index of each
/// word to `bounds`. The alternatives are tried in the pattern's order at each
/// position, leftmost-first as a backtracking regex engine would.
fn qwen2_split(cps: &[char], cls: &[u8], bounds: &mut Vec<usize>) {
    let end = cps.len();
    let class_at = |p: usize| -> Option<u8> { (p < end).then(|| cls[p]) };
    let is = |p: usize, bit: u8| class_at(p).is_some_and(|c| c & bit != 0);
    let newline = |p: usize| p < end && matches!(cps[p], '\r' | '\n');

    let mut pos = 0;
    while pos < end {
        let c = cps[pos];

        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == '\'' && pos + 1 < end {
            let c1 = cps[pos + 1].to_ascii_lowercase();
            if matches!(c1, 's' | 't' | 'm' | 'd') {
                pos += 2;
                bounds.push(pos);
                continue;
            }
            if pos + 2 < end {
                let c2 = cps[pos + 2].to_ascii_lowercase();
                if matches!((c1, c2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += 3;
                    bounds.push(pos);
                    continue;
                }
            }
        }

        // [^\r\n\p{L}\p{N}]?\p{L}+: one optional non-letter, non-number,
        // non-newline code point (a space, a quote, `_`, …) glued to a letter run.
        if !newline(pos) && !is(pos, NUMBER) && (is(pos, LETTER) || is(pos + 1, LETTER)) {
            pos += 1;
            while is(pos, LETTER) {
                pos += 1;
            }
            bounds.push(pos);
            continue;
        }

        // \p{N}: one digit at a time.
        if is(pos, NUMBER) {
            pos += 1;
            bounds.push(pos);
            continue;
        }

        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let lead = pos + usize::from(c == ' ');
        if class_at(lead) == Some(0) {
            pos = lead;
            while class_at(pos) == Some(0) {
                pos += 1;
            }
            while newline(pos) {
                pos += 1;
            }
            bounds.push(pos);
            continue;
        }

        let mut n_space = 0;
        let mut last_newline_end = None;
        while is(pos + n_space, SPACE) {
            if newline(pos + n_space) {
                last_newline_end = Some(pos + n_space + 1);
            }
            n_space += 1;
        }
        // `\s*[\r\n]+` (up to the last newline of the whitespace run) first.
        pos = last_newline_end.unwrap_or_else(|| space_run_end(pos, n_space, end));
        bounds.push(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        pre.split(s, &mut out);
        out.iter().map(|&(a, b)| &s[a..b]).collect()
    }

    #[test]
    fn gpt2_basics() {
        let p = PreTokenizer::Gpt2;
        assert_eq!(words(p, "Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(words(p, "I'm you'll"), ["I", "'m", " you", "'ll"]);
        assert_eq!(words(p, "a   b"), ["a", "  ", " b"]);
        assert_eq!(words(p, "a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(words(p, "x  "), ["x", "  "]);
        assert_eq!(words(p, " 123 ab"), [" 123", " ab"]);
        assert_eq!(words(p, ""), Vec::<&str>::new());
    }

    #[test]
    fn qwen2_basics() {
        let p = PreTokenizer::Qwen2;
        assert_eq!(words(p, "Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(words(p, "I'M you'LL"), ["I", "'M", " you", "'LL"]);
        assert_eq!(words(p, "x = 123"), ["x", " =", " ", "1", "2", "3"]);
        assert_eq!(words(p, "def f(_x):\n    return"), ["def", " f", "(_", "x", "):\n", "   ", " return"]);
        assert_eq!(words(p, "a \n\n  b"), ["a", " \n\n", " ", " b"]);
        assert_eq!(words(p, "\thello"), ["\thello"]);
        assert_eq!(words(p, "x  "), ["x", "  "]);
        assert_eq!(words(p, ""), Vec::<&str>::new());
    }

    #[test]
    fn smollm_splits_digits() {
        let p = PreTokenizer::SmolLm;
        assert_eq!(words(p, "x 42y"), ["x", " ", "4", "2", "y"]);
        assert_eq!(words(p, "v1.2"), ["v", "1", ".", "2"]);
        assert_eq!(words(p, "٣٤"), ["٣", "٤"]);
    }
}
