//! Code point classes and the GPT-2 byte <-> character mapping.
//!
//! The pre-tokenizer must classify code points exactly as llama.cpp does, or
//! words split differently and ids diverge. llama.cpp ships Unicode 15.1 data;
//! the pinned `unicode-general-category` crate is Unicode 15.0, and the only
//! 15.1 addition among letters and numbers is CJK Extension I, patched below.

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// Class bit: general category L* (`\p{L}`).
pub(crate) const LETTER: u8 = 1;
/// Class bit: general category N* (`\p{N}`).
pub(crate) const NUMBER: u8 = 2;
/// Class bit: White_Space (`\s` as llama.cpp defines it).
pub(crate) const SPACE: u8 = 4;

/// CJK Unified Ideographs Extension I (Unicode 15.1, all Lo).
const CJK_EXT_I: std::ops::RangeInclusive<u32> = 0x2EBF0..=0x2EE5D;

/// Class bits of one code point (0 = neither letter, number nor space).
#[inline]
pub(crate) fn class(c: char) -> u8 {
    if c.is_ascii() {
        return match c {
            'a'..='z' | 'A'..='Z' => LETTER,
            '0'..='9' => NUMBER,
            '\t' | '\n' | '\x0B' | '\x0C' | '\r' | ' ' => SPACE,
            _ => 0,
        };
    }
    if is_white_space(c) {
        return SPACE;
    }
    match get_general_category(c) {
        G::UppercaseLetter | G::LowercaseLetter | G::TitlecaseLetter | G::ModifierLetter | G::OtherLetter => LETTER,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => NUMBER,
        G::Unassigned if CJK_EXT_I.contains(&(c as u32)) => LETTER,
        _ => 0,
    }
}

/// The Unicode White_Space property (the set llama.cpp uses for `\s`).
#[inline]
fn is_white_space(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

/// True for the bytes GPT-2 keeps as their own code point.
const fn is_printable_byte(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

/// The 68 non-printable bytes in ascending order; GPT-2 maps the n-th of them
/// to U+0100 + n.
const EXTRA_BYTES: [u8; 68] = {
    let mut out = [0u8; 68];
    let mut n = 0;
    let mut b = 0u32;
    while b < 256 {
        if !is_printable_byte(b) {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    out
};

/// GPT-2's byte -> printable character table: byte-level BPE vocabularies store
/// every byte as a visible character so that tokens are valid text.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    for b in 0..256u32 {
        if is_printable_byte(b) {
            table[b as usize] = char::from_u32(b).expect("below U+0100");
        }
    }
    for (n, &b) in EXTRA_BYTES.iter().enumerate() {
        table[b as usize] = char::from_u32(0x100 + n as u32).expect("below U+0144");
    }
    table
}

/// Inverse of [`byte_to_char_table`]: the byte a vocabulary character stands for.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if is_printable_byte(cp) {
        Some(cp as u8)
    } else if (0x100..0x100 + EXTRA_BYTES.len() as u32).contains(&cp) {
        Some(EXTRA_BYTES[(cp - 0x100) as usize])
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_round_trips() {
        let t = byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(char_to_byte('a'), Some(b'a'));
        assert_eq!(char_to_byte('€'), None);
    }

    #[test]
    fn classes() {
        assert_eq!(class('a'), LETTER);
        assert_eq!(class('é'), LETTER);
        assert_eq!(class('你'), LETTER);
        assert_eq!(class('٣'), NUMBER);
        assert_eq!(class('²'), NUMBER);
        assert_eq!(class('\u{3000}'), SPACE);
        assert_eq!(class('\u{A0}'), SPACE);
        assert_eq!(class('!'), 0);
        assert_eq!(class('😀'), 0);
        assert_eq!(class('\u{0301}'), 0); // combining mark is not a letter
        assert_eq!(class('\u{2EBF0}'), LETTER); // Unicode 15.1 CJK Ext I
    }
}
