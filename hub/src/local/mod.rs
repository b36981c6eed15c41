//! The local backend's sandbox runtime: each sandbox is the `sandboxd`
//! library running in fresh namespaces and a cgroup on this machine.
//! (Being written.)
