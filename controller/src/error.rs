//! The one error of every reconciler. Each controller keeps its own
//! `error_policy` (how soon to retry differs), and each failure is counted in
//! `controller_runtime_reconcile_errors_total{controller, error}` under
//! [`Error::metric_label`].

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A child exists that the object may not take over (controlled by
    /// something else, or not labelled adoptable). Only a change of the
    /// objects fixes it.
    #[error("{0}")]
    ChildConflict(String),
    /// A write lost an optimistic-lock race twice in a row; retried soon.
    #[error("conflict: {0}")]
    LostRace(String),
}

impl Error {
    /// The `error` label of the reconcile-error counter: a small, fixed set.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api_error",
            Error::Kube(_) => "api_unreachable",
            Error::ChildConflict(_) => "child_conflict",
            Error::LostRace(_) => "lost_race",
        }
    }
}

/// The API server answered with this HTTP status (404, 409, ...).
pub fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_labels_are_fixed_words() {
        let api = kube::Error::Api(
            kube::core::Status::failure("gone", "NotFound")
                .with_code(404)
                .boxed(),
        );
        assert_eq!(Error::from(api).metric_label(), "api_error");
        assert_eq!(
            Error::ChildConflict("Pod p is controlled by X y".into()).metric_label(),
            "child_conflict"
        );
        assert_eq!(Error::LostRace("status".into()).metric_label(), "lost_race");
        assert_eq!(
            Error::LostRace("status".into()).to_string(),
            "conflict: status"
        );
    }
}
