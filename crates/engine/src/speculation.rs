//! Building a [`Speculator`] from user options (CLI and server share this).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tandem_gguf::Gguf;
use tandem_model::support::detect_kind;
use tandem_model::{DSparkModel, MtpHead, SupportError, SupportKind, TargetId};
use tandem_speculative::suffix;
use tandem_speculative::{
    DSparkDrafter, DSparkOptions, DraftModel, Drafter, HybridDrafter, MtpDrafter, NgramDrafter, SchedulerConfig, Setting, SpecConfig,
    SpecError, SpecLog, Speculator, SuffixCache, SuffixDrafter, SuffixOptions, VocabId,
};

use crate::session::{Conflict, SupportProblem};
use crate::{Engine, EngineError};

/// How to speculate.
#[derive(Debug, Clone, Default)]
pub struct SpecOptions {
    /// n-gram prompt lookup with n-gram sizes min..=max (with `mtp`: in
    /// front of the support model's drafter).
    pub lookup: Option<(usize, usize)>,
    /// A separate draft model with the target's vocabulary.
    pub draft_model: Option<PathBuf>,
    /// Most tokens drafted per cycle (None: the drafter's default).
    pub max_draft: Option<usize>,
    /// Always draft the maximum instead of the adaptive length.
    pub fixed_length: bool,
    /// ds4's faster, non-exact acceptance at temperature > 0.
    pub opportunistic: bool,
    /// Suffix speculation over this shared cache of recent outputs (alone,
    /// or in front of the support model or draft model).
    pub suffix: Option<SuffixCache>,
    /// Write each cycle's record as a JSON line to this file (`-`: stderr).
    pub log: Option<PathBuf>,
    /// A support file used as its kind says: an MTP head as MTP, a DSpark
    /// drafter as DSpark (the kind is decided by its tensors).
    pub drafter: Option<PathBuf>,
    /// A support file in ds4's spelling: an MTP head, or with `dspark` the
    /// DSpark drafter (a DSpark file without it is reported and decoding
    /// stays plain, as ds4 does).
    pub mtp: Option<PathBuf>,
    /// MTP: most chained draft steps per cycle (None: the measured default).
    pub mtp_draft: Option<usize>,
    /// MTP: stop drafting when a draft's top-1 minus top-2 logit is below this.
    pub mtp_margin: f32,
    /// Use a DSpark drafter found in the support file (without it, a DSpark
    /// file is reported and decoding stays plain, as ds4 does).
    pub dspark: bool,
    /// DSpark: slots per draft pass (None: the trained block size).
    pub dspark_block_size: Option<usize>,
    /// DSpark: stop at the first position whose confidence is below this
    /// (None: the scheduler chooses the length from the confidences).
    pub dspark_confidence: Option<f32>,
    /// DSpark: load and validate the drafter, then decode target-only.
    pub dspark_strict: bool,
    /// A support file that cannot be used is an error instead of a warning
    /// followed by plain decoding.
    pub require: bool,
}

/// Default n-gram sizes of prompt lookup (smallest, largest).
pub const LOOKUP_DEFAULT_NGRAM: (usize, usize) = (1, 4);

/// Default lookup proposal length.
pub const LOOKUP_DEFAULT_DRAFT: usize = 10;

/// Default draft-model proposal length.
pub const DRAFT_MODEL_DEFAULT_DRAFT: usize = 6;

/// Default chained MTP steps per cycle (the adaptive scheduler may use fewer).
pub const MTP_DEFAULT_DRAFT: usize = 1;

impl SpecOptions {
    /// Save the suffix cache to its file, if it has one (after a
    /// generation); a cache that cannot be saved is reported and decoding
    /// goes on.
    pub fn persist(&self) {
        if let Some(c) = &self.suffix {
            if let Err(e) = c.persist() {
                tracing::warn!("{e}");
            }
        }
    }

    pub fn enabled(&self) -> bool {
        self.lookup.is_some() || self.suffix.is_some() || self.draft_model.is_some() || self.mtp.is_some() || self.drafter.is_some()
    }
}

impl Engine {
    /// The speculator the options ask for, or None when speculation is off.
    pub fn speculator(&self, o: &SpecOptions, ctx: usize) -> Result<Option<Speculator>, EngineError> {
        if let Some(path) = &o.drafter {
            if o.mtp.is_some() {
                return Err(EngineError::Conflict(Conflict::SupportFileTwice));
            }
            // the file's kind decides how it drafts
            let dspark = match self.open_support(path) {
                Ok((_, kind)) => kind == SupportKind::DSpark,
                Err(_) => o.dspark,
            };
            let o = SpecOptions { mtp: Some(path.clone()), drafter: None, dspark: dspark || o.dspark, ..o.clone() };
            return self.speculator(&o, ctx);
        }
        if o.suffix.is_some() && o.lookup.is_some() {
            return Err(EngineError::Conflict(Conflict::SuffixWithLookup));
        }
        if o.draft_model.is_some() && (o.lookup.is_some() || o.mtp.is_some()) {
            return Err(EngineError::Conflict(Conflict::DraftModelWithOthers));
        }
        if o.mtp.is_none() && (o.dspark || o.dspark_block_size.is_some() || o.dspark_confidence.is_some()) {
            return Err(EngineError::Conflict(Conflict::DSparkWithoutSupportFile));
        }
        // the model drafter, if any
        let model: Option<Box<dyn Drafter>> = if let Some(path) = &o.mtp {
            match self.support_drafter(path, o, ctx) {
                // strict DSpark: target-only
                Ok(None) => return Ok(None),
                Ok(Some(d)) => Some(d),
                Err(e) if !o.require && matches!(e, EngineError::SupportFile { .. }) => {
                    match (&o.suffix, o.lookup) {
                        (Some(_), _) => tracing::warn!("{e}; continuing with suffix speculation alone"),
                        (None, Some(_)) => tracing::warn!("{e}; continuing with prompt lookup alone"),
                        (None, None) => {
                            tracing::warn!("{e}; continuing with plain decoding");
                            return Ok(None);
                        }
                    }
                    None
                }
                Err(e) => return Err(e),
            }
        } else if let Some(path) = &o.draft_model {
            let k = o.max_draft.unwrap_or(DRAFT_MODEL_DEFAULT_DRAFT);
            check_draft_length(k)?;
            Some(self.draft_model(path, ctx, k)?)
        } else {
            None
        };
        // a free source in front of it, or alone
        if let Some(cache) = &o.suffix {
            let k = o.max_draft.unwrap_or(suffix::DEFAULT_DRAFT);
            check_draft_length(k)?;
            let free = SuffixDrafter::new(cache.clone(), SuffixOptions { max_draft: k, ..Default::default() })?;
            let d = Box::new(HybridDrafter::new(Box::new(free), model));
            let k = d.max_draft();
            return Ok(Some(Speculator::new(d, self.spec_config(o, k)?)?));
        }
        let k = o.max_draft.unwrap_or(LOOKUP_DEFAULT_DRAFT);
        let d: Box<dyn Drafter> = match (o.lookup, model) {
            // prompt lookup first, the support model where nothing repeats
            (Some((lo, hi)), Some(m)) if o.mtp.is_some() => Box::new(HybridDrafter::new(Box::new(NgramDrafter::new(lo, hi, k)?), Some(m))),
            (_, Some(m)) => m,
            (Some((lo, hi)), None) => {
                check_draft_length(k)?;
                Box::new(NgramDrafter::new(lo, hi, k)?)
            }
            (None, None) => return Ok(None),
        };
        let k = d.max_draft();
        Ok(Some(Speculator::new(d, self.spec_config(o, k)?)?))
    }

    /// A separate draft model with the target's vocabulary.
    fn draft_model(&self, path: &Path, ctx: usize, k: usize) -> Result<Box<dyn Drafter>, EngineError> {
        if !path.exists() {
            return Err(EngineError::DraftModelNotFound(path.to_path_buf()));
        }
        let draft = Engine::load(path, self.pool.threads())?;
        let (a, b) = (&self.tokenizer, &draft.tokenizer);
        if a.vocab_size() != b.vocab_size() || a.vocab_hash() != b.vocab_hash() {
            return Err(SpecError::VocabMismatch(format!(
                "{} has {} tokens (hash {:016x}), the target {} (hash {:016x})",
                path.display(),
                b.vocab_size(),
                b.vocab_hash(),
                a.vocab_size(),
                a.vocab_hash()
            ))
            .into());
        }
        // the draft shares the target's worker pool: they never run at once
        Ok(Box::new(DraftModel::new(draft.model.clone(), self.pool.clone(), self.model.cfg.vocab, ctx, k)?))
    }

    /// The global suffix cache for suffix speculation: kept in `file`
    /// between runs when given (loaded now if it exists), else in memory.
    pub fn suffix_cache(&self, file: Option<&Path>, tokens: usize) -> Result<SuffixCache, EngineError> {
        if tokens == 0 {
            return Err(SpecError::setting(Setting::SuffixCacheTokens, tokens, "need at least 1 token").into());
        }
        let depth = suffix::DEFAULT_DEPTH;
        Ok(match file {
            Some(path) => SuffixCache::open(path, tokens, depth, self.vocab_id()).map_err(SpecError::from)?,
            None => SuffixCache::new(tokens, depth),
        })
    }

    /// The vocabulary's identity, as suffix cache files record it.
    pub fn vocab_id(&self) -> VocabId {
        VocabId { size: self.tokenizer.vocab_size() as u32, hash: self.tokenizer.vocab_hash() }
    }

    fn spec_config(&self, o: &SpecOptions, k: usize) -> Result<SpecConfig, EngineError> {
        // TANDEM_SPEC_LOG=1 logs to stderr, any other value names a file
        let env =
            std::env::var_os("TANDEM_SPEC_LOG").filter(|v| !v.is_empty()).map(|v| if v == "1" { "-".into() } else { PathBuf::from(v) });
        let log = match o.log.clone().or(env) {
            Some(path) => Some(SpecLog::create(&path).map_err(|source| EngineError::SpecLog { path: path.clone(), source })?),
            None => None,
        };
        Ok(SpecConfig {
            max_draft: k,
            scheduler: SchedulerConfig { adaptive: !o.fixed_length, ..Default::default() },
            opportunistic: o.opportunistic,
            log,
        })
    }

    /// This target's identity, as support files record it.
    pub fn target_id(&self) -> TargetId {
        TargetId::new(&self.model.cfg, self.tokenizer.vocab_hash())
    }

    /// Open a support file and tell its kind.
    fn open_support(&self, path: &Path) -> Result<(Arc<Gguf>, SupportKind), EngineError> {
        let support = |e: SupportError| support_error(path, SupportProblem::Invalid(e.to_string()));
        if !path.exists() {
            return Err(support_error(path, SupportProblem::NotFound));
        }
        let g = Arc::new(Gguf::open(path).map_err(|e| support(e.into()))?);
        let kind = detect_kind(&g).map_err(support)?;
        Ok((g, kind))
    }

    /// Load and validate an MTP head for this target.
    pub fn load_mtp_head(&self, path: &Path) -> Result<MtpHead, EngineError> {
        match self.open_support(path)? {
            (g, SupportKind::Mtp) => MtpHead::load(g, self.model.clone(), &self.target_id())
                .map_err(|e| support_error(path, SupportProblem::Invalid(e.to_string()))),
            (_, SupportKind::DSpark) => Err(support_error(path, SupportProblem::DSparkNotAskedFor)),
        }
    }

    /// Load and validate a DSpark drafter for this target.
    pub fn load_dspark(&self, path: &Path) -> Result<DSparkModel, EngineError> {
        match self.open_support(path)? {
            (g, SupportKind::DSpark) => DSparkModel::load(g, self.model.clone(), &self.target_id())
                .map_err(|e| support_error(path, SupportProblem::Invalid(e.to_string()))),
            (_, SupportKind::Mtp) => Err(support_error(path, SupportProblem::NotDSpark)),
        }
    }

    /// The drafter of a support file; None when it is loaded but decoding
    /// stays target-only (`--dspark-strict`).
    fn support_drafter(&self, path: &Path, o: &SpecOptions, ctx: usize) -> Result<Option<Box<dyn Drafter>>, EngineError> {
        if o.dspark {
            let model = Arc::new(self.load_dspark(path)?);
            let block_size = o.dspark_block_size.unwrap_or(model.cfg.block_size);
            let opts = DSparkOptions { block_size, confidence: o.dspark_confidence };
            let drafter = DSparkDrafter::new(model, self.pool.clone(), ctx, opts)?;
            if o.dspark_strict {
                tracing::info!("{} loaded and valid; strict DSpark mode decodes target-only", drafter.name());
                return Ok(None);
            }
            return Ok(Some(Box::new(drafter)));
        }
        // with lookup or suffix trees in front, --draft-max is their length
        let k = o.mtp_draft.or(o.max_draft.filter(|_| o.lookup.is_none() && o.suffix.is_none())).unwrap_or(MTP_DEFAULT_DRAFT);
        if k == 0 || k > tandem_speculative::MAX_DRAFT {
            return Err(SpecError::setting(Setting::MtpDraftSteps, k, format!("need 1..={}", tandem_speculative::MAX_DRAFT)).into());
        }
        let head = Arc::new(self.load_mtp_head(path)?);
        Ok(Some(Box::new(MtpDrafter::new(head, self.pool.clone(), ctx, k, o.mtp_margin)?)))
    }
}

fn check_draft_length(k: usize) -> Result<(), EngineError> {
    if k == 0 || k > tandem_speculative::MAX_DRAFT {
        return Err(SpecError::setting(Setting::DraftLength, k, format!("need 1..={}", tandem_speculative::MAX_DRAFT)).into());
    }
    Ok(())
}

fn support_error(path: &Path, problem: SupportProblem) -> EngineError {
    EngineError::SupportFile { path: path.to_path_buf(), problem }
}
