//! metav1.Condition bookkeeping: set a condition keeping its lastTransitionTime while its
//! status does not change (the KEP convention every client relies on).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub fn find<'a>(conds: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

pub fn new(
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(Timestamp::now()),
    }
}

/// Inserts or updates `cond`. The transition time moves only when the status changes.
pub fn set(conds: &mut Vec<Condition>, mut cond: Condition) {
    match conds.iter_mut().find(|c| c.type_ == cond.type_) {
        Some(existing) => {
            if existing.status == cond.status {
                cond.last_transition_time = existing.last_transition_time.clone();
            }
            *existing = cond;
        }
        None => conds.push(cond),
    }
}

pub fn remove(conds: &mut Vec<Condition>, type_: &str) {
    conds.retain(|c| c.type_ != type_);
}

/// Whether two condition lists say the same thing (ignoring order).
pub fn same(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len() && a.iter().all(|c| find(b, &c.type_) == Some(c))
}

pub fn is_true(conds: &[Condition], type_: &str) -> bool {
    find(conds, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let mut conds = vec![];
        let mut first = new("Ready", "False", "A", "m", Some(1));
        first.last_transition_time = Time("2026-01-01T00:00:00Z".parse().unwrap());
        set(&mut conds, first.clone());
        set(&mut conds, new("Ready", "False", "B", "other", Some(2)));
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].reason, "B");
        assert_eq!(conds[0].last_transition_time, first.last_transition_time);
        set(&mut conds, new("Ready", "True", "C", "", Some(2)));
        assert_ne!(conds[0].last_transition_time, first.last_transition_time);
        assert!(is_true(&conds, "Ready"));
        remove(&mut conds, "Ready");
        assert!(conds.is_empty());
    }
}
