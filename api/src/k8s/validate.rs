//! The v1.0.9 `volumeClaimTemplates` rules as a pure function. The CRD schema and its CEL
//! rules make the apiserver enforce the same rules at admission; the controller calls this
//! for objects that got in another way (an older CRD, an edit of storage) so they end with a
//! clear condition instead of a PVC or Pod create that fails forever.

use std::collections::HashSet;
use std::fmt;

use super::common::{
    PersistentVolumeClaimTemplate, MAX_VOLUME_CLAIM_TEMPLATES, MAX_VOLUME_CLAIM_TEMPLATE_NAME,
};

/// The first rule a `volumeClaimTemplates` list breaks. `Display` names the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VctError {
    TooMany { count: usize },
    MissingName { index: usize },
    NameTooLong { index: usize, name: String },
    DuplicateName { name: String },
}

impl fmt::Display for VctError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VctError::TooMany { count } => write!(
                f,
                "volumeClaimTemplates has {count} entries, at most {MAX_VOLUME_CLAIM_TEMPLATES} are allowed"
            ),
            VctError::MissingName { index } => {
                write!(f, "volumeClaimTemplates[{index}].metadata.name is required and must not be empty")
            }
            VctError::NameTooLong { index, name } => write!(
                f,
                "volumeClaimTemplates[{index}].metadata.name {name:?} is longer than {MAX_VOLUME_CLAIM_TEMPLATE_NAME} characters"
            ),
            VctError::DuplicateName { name } => {
                write!(f, "volumeClaimTemplates names must be unique: {name:?} appears more than once")
            }
        }
    }
}

impl std::error::Error for VctError {}

/// Checks the admission rules in the order the apiserver reports them: size, then each
/// entry's name, then uniqueness.
pub fn validate_volume_claim_templates(
    vcts: &[PersistentVolumeClaimTemplate],
) -> Result<(), VctError> {
    if vcts.len() > MAX_VOLUME_CLAIM_TEMPLATES {
        return Err(VctError::TooMany { count: vcts.len() });
    }
    let mut seen = HashSet::with_capacity(vcts.len());
    for (index, vct) in vcts.iter().enumerate() {
        let name = vct.metadata.name.as_str();
        if name.is_empty() {
            return Err(VctError::MissingName { index });
        }
        if name.chars().count() > MAX_VOLUME_CLAIM_TEMPLATE_NAME {
            return Err(VctError::NameTooLong {
                index,
                name: name.to_owned(),
            });
        }
        if !seen.insert(name) {
            return Err(VctError::DuplicateName {
                name: name.to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::common::EmbeddedObjectMetadata;

    fn vct(name: &str) -> PersistentVolumeClaimTemplate {
        PersistentVolumeClaimTemplate {
            metadata: EmbeddedObjectMetadata {
                name: name.into(),
                ..Default::default()
            },
            spec: Default::default(),
        }
    }

    #[test]
    fn accepts_unique_names_up_to_the_limits() {
        let many: Vec<_> = (0..128).map(|i| vct(&format!("v{i}"))).collect();
        assert_eq!(validate_volume_claim_templates(&many), Ok(()));
        assert_eq!(
            validate_volume_claim_templates(&[vct(&"a".repeat(63))]),
            Ok(())
        );
        assert_eq!(validate_volume_claim_templates(&[]), Ok(()));
    }

    #[test]
    fn rejects_each_rule_with_a_message_naming_it() {
        let many: Vec<_> = (0..129).map(|i| vct(&format!("v{i}"))).collect();
        let err = validate_volume_claim_templates(&many).unwrap_err();
        assert_eq!(err, VctError::TooMany { count: 129 });
        assert!(err.to_string().contains("at most 128"));

        let err = validate_volume_claim_templates(&[vct("a"), vct("")]).unwrap_err();
        assert_eq!(err, VctError::MissingName { index: 1 });
        assert!(err.to_string().contains("metadata.name is required"));

        let long = "a".repeat(64);
        let err = validate_volume_claim_templates(&[vct(&long)]).unwrap_err();
        assert!(err.to_string().contains("longer than 63"));

        let err =
            validate_volume_claim_templates(&[vct("data"), vct("x"), vct("data")]).unwrap_err();
        assert_eq!(
            err,
            VctError::DuplicateName {
                name: "data".into()
            }
        );
        assert!(err.to_string().contains("must be unique"));
    }
}
