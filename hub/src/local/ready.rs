//! Which sandboxes were Ready, for whom, as of a store generation: what a
//! proxied request to a port checks each time, answered from memory while
//! no row of the store has changed since it was read.
//!
//! Every change the store makes (a state, a delete, a claim, the activity
//! stamp) moves [`Store::generation`](super::store::Store::generation), so
//! an entry is only ever used in the generation it was read in: the answer
//! a lookup would give. Anything but Ready is never kept, and always asked.

use std::{collections::HashMap, sync::Mutex};

use super::store::Activity;

/// Past this many sandboxes, the map starts again (it holds only those
/// reached through a port since the last change, so it refills at once).
const MAX_ENTRIES: usize = 4096;

#[derive(Default)]
pub(super) struct ReadyCache {
    by_id: Mutex<HashMap<String, Seen>>,
}

struct Seen {
    tenant: String,
    generation: u64,
    activity: Activity,
}

impl ReadyCache {
    /// What was read of sandbox `id`, if it was seen Ready and `tenant`'s
    /// in `generation`, the store's current one.
    pub(super) fn get(&self, tenant: &str, id: &str, generation: u64) -> Option<Activity> {
        let by_id = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        by_id
            .get(id)
            .filter(|s| s.generation == generation && s.tenant == tenant)
            .map(|s| s.activity)
    }

    /// Records that `id` was read Ready and `tenant`'s, as `activity` says,
    /// by a lookup begun in `generation` (read before the lookup, so a
    /// change racing it leaves the entry already stale).
    pub(super) fn put(&self, tenant: &str, id: &str, generation: u64, activity: Activity) {
        let mut by_id = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        if by_id.len() >= MAX_ENTRIES && !by_id.contains_key(id) {
            by_id.clear();
        }
        by_id.insert(
            id.to_string(),
            Seen {
                tenant: tenant.to_string(),
                generation,
                activity,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::store::Shim;
    use sandhub_api::hub::SandboxState;

    fn at(last_activity: i64) -> Activity {
        Activity {
            state: SandboxState::Ready,
            last_activity,
            shim: Some(Shim {
                pid: 7,
                start_time: 1,
            }),
        }
    }

    #[test]
    fn an_entry_answers_only_its_tenant_in_its_generation() {
        let c = ReadyCache::default();
        assert_eq!(c.get("t", "sb-1", 7), None);
        c.put("t", "sb-1", 7, at(1000));
        assert_eq!(c.get("t", "sb-1", 7), Some(at(1000)));
        assert_eq!(c.get("other", "sb-1", 7), None, "another tenant's");
        assert_eq!(c.get("t", "sb-1", 8), None, "the store changed since");
        assert_eq!(c.get("t", "sb-2", 7), None);
    }

    #[test]
    fn the_map_is_bounded() {
        let c = ReadyCache::default();
        for i in 0..MAX_ENTRIES + 10 {
            c.put("t", &format!("sb-{i}"), 1, at(0));
        }
        let n = c.by_id.lock().unwrap().len();
        assert!(n <= MAX_ENTRIES, "{n}");
        assert_eq!(
            c.get("t", &format!("sb-{}", MAX_ENTRIES + 9), 1),
            Some(at(0))
        );
    }
}
