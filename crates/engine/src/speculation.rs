//! Building a [`Speculator`] from user options (CLI and server share this).

use std::path::PathBuf;

use tandem_spec::{DraftModel, NgramDrafter, SchedulerConfig, SpecConfig, SpecError, Speculator};

use crate::{Engine, EngineError};

/// How to speculate.
#[derive(Debug, Clone, Default)]
pub struct SpecOptions {
    /// n-gram prompt lookup with n-gram sizes min..=max.
    pub lookup: Option<(usize, usize)>,
    /// A separate draft model with the target's vocabulary.
    pub draft_model: Option<PathBuf>,
    /// Most tokens drafted per cycle (None: the drafter's default).
    pub max_draft: Option<usize>,
    /// Always draft the maximum instead of the adaptive length.
    pub fixed_length: bool,
    /// ds4's faster, non-exact acceptance at temperature > 0.
    pub opportunistic: bool,
    /// One log line per cycle.
    pub log: bool,
}

impl SpecOptions {
    pub fn enabled(&self) -> bool {
        self.lookup.is_some() || self.draft_model.is_some()
    }
}

impl Engine {
    /// The speculator the options ask for, or None when speculation is off.
    pub fn speculator(&self, o: &SpecOptions, ctx: usize) -> Result<Option<Speculator>, EngineError> {
        if o.lookup.is_some() && o.draft_model.is_some() {
            return Err(SpecError::BadOption("choose one drafter: --lookup or --draft-model".into()).into());
        }
        let default_k = if o.lookup.is_some() { 10 } else { 6 };
        let k = o.max_draft.unwrap_or(default_k);
        if k == 0 || k > tandem_spec::MAX_DRAFT {
            return Err(SpecError::BadOption(format!("draft length {k} out of range 1..={}", tandem_spec::MAX_DRAFT)).into());
        }
        let drafter: Box<dyn tandem_spec::Drafter> = if let Some((lo, hi)) = o.lookup {
            Box::new(NgramDrafter::new(lo, hi, k)?)
        } else if let Some(path) = &o.draft_model {
            if !path.exists() {
                return Err(SpecError::BadOption(format!("draft model not found: {}", path.display())).into());
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
            Box::new(DraftModel::new(draft.model.clone(), self.pool.clone(), self.model.cfg.vocab, ctx, k)?)
        } else {
            return Ok(None);
        };
        let cfg = SpecConfig {
            max_draft: k,
            scheduler: SchedulerConfig { adaptive: !o.fixed_length, ..Default::default() },
            opportunistic: o.opportunistic,
            log: o.log || std::env::var("TANDEM_SPEC_LOG").map(|v| v == "1").unwrap_or(false),
        };
        Ok(Some(Speculator::new(drafter, cfg)?))
    }
}
