//! Error messages in the CLI's terms: the libraries name what a setting
//! sets, these messages name the flag that sets it.

use tandem_engine::{Conflict, EngineError, Setting, SpecError, SupportProblem};

/// The flag that sets `s`.
pub fn flag(s: Setting) -> &'static str {
    match s {
        Setting::DraftLength => "--draft-max",
        Setting::LookupNgram => "--lookup-ngram-min/--lookup-ngram-max",
        Setting::MtpDraftSteps => "--mtp-draft",
        Setting::MtpMargin => "--mtp-margin",
        Setting::DSparkBlockSize => "--dspark-block-size",
        Setting::DSparkConfidence => "--dspark-confidence",
        // fixed by the engine, not set by a flag
        Setting::SuffixMatch | Setting::SuffixMinProb => "--suffix",
        Setting::SuffixCacheTokens => "--suffix-cache-tokens",
    }
}

/// The message for `e` and its causes (joined as anyhow's `{:#}` joins
/// them), with flags named where a library error names a setting.
pub fn message(e: &anyhow::Error) -> String {
    let mut parts = Vec::new();
    for cause in e.chain() {
        let mapped = match (cause.downcast_ref::<EngineError>(), cause.downcast_ref::<SpecError>()) {
            (Some(e), _) => engine(e),
            (None, Some(e)) => spec(e),
            _ => None,
        };
        match mapped {
            Some(m) => {
                parts.push(m);
                break;
            }
            None => parts.push(cause.to_string()),
        }
    }
    parts.join(": ")
}

fn engine(e: &EngineError) -> Option<String> {
    Some(match e {
        EngineError::Spec(e) => return spec(e),
        EngineError::Conflict(c) => match c {
            Conflict::DraftModelWithOthers => "--draft-model cannot be combined with --lookup, --mtp or --drafter".into(),
            Conflict::DSparkWithoutSupportFile => "--dspark options need a support file: --mtp FILE --dspark, or --drafter FILE".into(),
            Conflict::SupportFileTwice => "give the support file once: --drafter FILE or --mtp FILE".into(),
            Conflict::SuffixWithLookup => "--suffix already searches the prompt and the output: use --suffix or --lookup, not both".into(),
        },
        EngineError::SupportFile { path, problem: SupportProblem::DSparkNotAskedFor } => {
            format!("--mtp {}: DSpark drafter detected; add --dspark (or give it with --drafter) to decode with it", path.display())
        }
        EngineError::SupportFile { path, problem: SupportProblem::NotDSpark } => {
            format!("--mtp {} --dspark: the file holds an MTP head, not a DSpark drafter (drop --dspark to use it)", path.display())
        }
        _ => return None,
    })
}

fn spec(e: &SpecError) -> Option<String> {
    match e {
        SpecError::Setting { setting, value, need } => Some(format!("{} {value}: {need}", flag(*setting))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_settings_are_named_by_their_flags() {
        let e = anyhow::Error::from(EngineError::Spec(SpecError::setting(Setting::DSparkBlockSize, 9, "need 1..=4 (the trained size)")))
            .context("loading the drafter");
        assert_eq!(message(&e), "loading the drafter: --dspark-block-size 9: need 1..=4 (the trained size)");
        let e = anyhow::Error::from(EngineError::Conflict(Conflict::DSparkWithoutSupportFile));
        assert!(message(&e).contains("--mtp FILE --dspark"), "{}", message(&e));
        // errors without a flag read as the library wrote them
        let e = anyhow::Error::from(EngineError::EmptyPrompt);
        assert_eq!(message(&e), "empty prompt");
    }
}
