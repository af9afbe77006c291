/// Everything that can be wrong with a GGUF file, as a typed error.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("I/O error on {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a GGUF file (magic {0:02x?}, expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: needed {needed} bytes at offset {offset} while reading {what}, file has {len}")]
    Truncated { what: &'static str, offset: u64, needed: u64, len: u64 },
    #[error("absurd {what}: {value} (limit {limit})")]
    AbsurdCount { what: &'static str, value: u64, limit: u64 },
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    #[error("unknown tensor type {ty}{} for tensor '{name}'", ggml_type_note(*ty))]
    UnknownTensorType { name: String, ty: u32 },
    #[error("string at offset {0} is not valid UTF-8")]
    BadUtf8(u64),
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
    #[error("invalid alignment {0} (must be a power of two, 1..=65536)")]
    BadAlignment(u64),
    #[error("tensor '{name}': {reason}")]
    BadTensor { name: String, reason: String },
    #[error("tensor '{name}' data [{start}, {end}) lies outside the data section of {len} bytes")]
    TensorOutOfBounds { name: String, start: u64, end: u64, len: u64 },
    #[error("tensor '{name}' offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor { name: String, offset: u64, alignment: u64 },
    #[error("metadata key '{key}': expected {expected}, found {found}")]
    WrongType { key: String, expected: &'static str, found: &'static str },
    #[error("metadata key '{0}' is missing")]
    MissingKey(String),
    #[error("tensor '{0}' not found")]
    MissingTensor(String),
    #[error("writer: {0}")]
    Write(String),
}

impl GgufError {
    pub(crate) fn bad_tensor(name: &str, reason: impl Into<String>) -> Self {
        GgufError::BadTensor { name: name.to_string(), reason: reason.into() }
    }
}

/// The ggml name of a tensor type that ggml defines but tandem cannot read,
/// so that a refusal names the format (a file quantized by llama.cpp's
/// converter to NVFP4 says so instead of showing a bare number).
fn ggml_type_note(ty: u32) -> String {
    let name = match ty {
        4 => "Q4_2 (removed from ggml)",
        5 => "Q4_3 (removed from ggml)",
        10 => "Q2_K",
        11 => "Q3_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        40 => "NVFP4",
        41 => "Q1_0",
        42 => "Q2_0",
        _ => return String::new(),
    };
    format!(" ({name}, not supported)")
}
