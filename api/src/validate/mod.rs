//! What a request must satisfy before any backend acts on it, stated once so
//! the local and the kubernetes backend refuse the same requests with the
//! same `{code, message}`: names, labels, environment, lifetimes, template
//! limits, pool sizes, image references (prepull and pull requests) and
//! brokered secrets (`secrets.rs`).
//! Pure checks: no I/O, nothing about the host (a template's host
//! directories are the local backend's own business).

use std::collections::BTreeMap;

use crate::{
    error::{Code, ErrorBody},
    hub::{
        is_dns_label, is_reserved_label, CreateSandbox, ExecRequest, ForkRequest, Network,
        NetworkSpec, PoolSpec, PrepullRequest, PullRequest, Sidecar, Template, MAX_CPU,
        MAX_DISK_MB, MAX_MEMORY_MB, MAX_PIDS, MAX_PREPULL_IMAGES_PER_POD, MAX_PREPULL_PARALLEL,
        MAX_PREPULL_REFERENCES, MAX_PREPULL_TIMEOUT_SECONDS, MAX_SIDECARS, MIN_CPU, MIN_DISK_MB,
        MIN_MEMORY_MB, MIN_PIDS, RESERVED_LABEL_DOMAINS,
    },
    limits,
    network::{parse_list, Pattern, Target},
};

/// Most labels one sandbox may carry.
pub const MAX_LABELS: usize = 64;
/// Most warm members one pool may ask for.
pub const MAX_REPLICAS: u32 = 1000;

fn invalid(message: String) -> ErrorBody {
    ErrorBody::new(Code::InvalidArgument, message)
}

/// A template's or pool's name: a DNS-1123 label, so it can name cluster
/// objects and directories alike. `kind` ("template", "pool") starts the
/// message.
pub fn name(kind: &str, name: &str) -> Result<(), ErrorBody> {
    if is_dns_label(name) {
        return Ok(());
    }
    Err(invalid(format!(
        "{kind} name `{name}` must be a DNS-1123 label: 1-63 of [a-z0-9-], not starting or ending with `-`"
    )))
}

/// Labels: at most [`MAX_LABELS`], in the character sets both backends can
/// store (Kubernetes' label syntax, loosely), and none under a
/// [`RESERVED_LABEL_DOMAINS`] prefix.
pub fn labels(labels: &BTreeMap<String, String>) -> Result<(), ErrorBody> {
    if labels.len() > MAX_LABELS {
        return Err(invalid(format!("at most {MAX_LABELS} labels")));
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= 253
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
        let value_ok = v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !key_ok || !value_ok {
            return Err(invalid(format!(
                "label {k}={v}: keys are [A-Za-z0-9-_./] (≤253), values [A-Za-z0-9-_.] (≤63)"
            )));
        }
        if is_reserved_label(k) {
            return Err(invalid(format!(
                "label {k}: the prefixes {} are reserved",
                RESERVED_LABEL_DOMAINS.join(", ")
            )));
        }
    }
    Ok(())
}

/// Environment for a sandbox's processes: a key that is empty or holds `=`
/// or NUL, or a value with NUL, cannot be set, and would only fail the start.
pub fn env(env: &BTreeMap<String, String>) -> Result<(), ErrorBody> {
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(invalid(format!(
                "env {k:?}: names must be non-empty without `=` or NUL, values without NUL"
            )));
        }
    }
    Ok(())
}

/// The resource limits a template may ask for: below them a sandbox cannot
/// start its own daemon, above them no kernel enforces the value.
pub fn template_limits(t: &Template) -> Result<(), ErrorBody> {
    if let Some(cpu) = t.cpu {
        if !(cpu.is_finite() && (MIN_CPU..=MAX_CPU).contains(&cpu)) {
            return Err(invalid(format!("cpu must be {MIN_CPU} to {MAX_CPU} cores")));
        }
    }
    if t.memory_mb
        .is_some_and(|m| !(MIN_MEMORY_MB..=MAX_MEMORY_MB).contains(&m))
    {
        return Err(invalid(format!(
            "memory_mb must be {MIN_MEMORY_MB} to {MAX_MEMORY_MB}"
        )));
    }
    if t.pids.is_some_and(|p| !(MIN_PIDS..=MAX_PIDS).contains(&p)) {
        return Err(invalid(format!("pids must be {MIN_PIDS} to {MAX_PIDS}")));
    }
    if t.disk_mb
        .is_some_and(|d| !(MIN_DISK_MB..=MAX_DISK_MB).contains(&d))
    {
        return Err(invalid(format!(
            "disk_mb must be {MIN_DISK_MB} to {MAX_DISK_MB}"
        )));
    }
    if t.egress_mb
        .is_some_and(|m| !(1..=crate::hub::MAX_EGRESS_MB).contains(&m))
    {
        return Err(invalid(format!(
            "egress_mb must be 1 to {}",
            crate::hub::MAX_EGRESS_MB
        )));
    }
    Ok(())
}

impl ExecRequest {
    /// Refuses an empty command and a timeout outside
    /// [`limits::MIN_TIMEOUT_SECONDS`] to [`limits::MAX_TIMEOUT_SECONDS`].
    pub fn validate(&self) -> Result<(), ErrorBody> {
        limits::optional_timeout("timeout_seconds", self.timeout_seconds)?;
        if self.command.argv().first().is_none_or(|p| p.is_empty()) {
            return Err(ErrorBody::new(Code::InvalidArgument, "command is empty"));
        }
        if let Some(c) = &self.container {
            container_name(c)?;
            if !self.env.is_empty() || !self.cwd.is_empty() {
                return Err(ErrorBody::new(
                    Code::InvalidArgument,
                    "env and cwd are not available with `container` (the Pod's exec API has neither)",
                ));
            }
        }
        Ok(())
    }
}

impl CreateSandbox {
    /// Refuses lifetimes outside [`limits::MIN_LIFETIME_SECONDS`] to
    /// [`limits::MAX_LIFETIME_SECONDS`] (a deadline past the clock's end
    /// would overflow it), then bad [`labels`] and [`env`].
    pub fn validate(&self) -> Result<(), ErrorBody> {
        limits::optional_lifetime("shutdown_after_seconds", self.shutdown_after_seconds)?;
        limits::optional_lifetime("idle_timeout_seconds", self.idle_timeout_seconds)?;
        labels(&self.labels)?;
        if let Some(n) = &self.network {
            network(n)?;
        }
        secrets(&self.secrets)?;
        volume_mounts(&self.volumes)?;
        env(&self.env)
    }
}

impl Template {
    /// Its [`template_limits`] and its [`env`]. Host directories
    /// (`root_fs`, `seed_dir`) are checked by the backend that has a host.
    pub fn validate(&self) -> Result<(), ErrorBody> {
        template_limits(self)?;
        secrets(&self.secrets)?;
        if !self.secrets.is_empty() && self.network.mode != Network::Egress {
            return Err(invalid(
                "secrets need `network: egress`: only the egress gateway can broker them".into(),
            ));
        }
        if let Some(image) = &self.image {
            image_reference(image)?;
            if self.root_fs.is_some() {
                return Err(invalid(
                    "a template names its root once: `image` or `root_fs`, not both".into(),
                ));
            }
        }
        if let Some(dir) = &self.workdir {
            workdir(dir)?;
        }
        if let Some(u) = &self.user {
            user(u)?;
        }
        if let Some(argv) = &self.entrypoint {
            entrypoint(argv)?;
        }
        sidecars(&self.sidecars)?;
        volume_mounts(&self.volumes)?;
        network(&self.network)?;
        env(&self.env)
    }
}

/// A container's name: a DNS label; `sandboxd` and `sandhub-*` are the
/// hub's own.
pub fn container_name(name: &str) -> Result<(), ErrorBody> {
    if !is_dns_label(name) || name == "sandboxd" || name.starts_with("sandhub-") {
        return Err(invalid(format!(
            "container must be a DNS label other than sandboxd and sandhub-*, not {:?}",
            name.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// At most [`MAX_SIDECARS`], uniquely named, each with a valid
/// image, command, env and limits.
pub fn sidecars(sidecars: &[Sidecar]) -> Result<(), ErrorBody> {
    if sidecars.len() > MAX_SIDECARS {
        return Err(invalid(format!("at most {} sidecars", MAX_SIDECARS)));
    }
    let mut seen = std::collections::BTreeSet::new();
    for s in sidecars {
        container_name(&s.name)?;
        if !seen.insert(s.name.as_str()) {
            return Err(invalid(format!("sidecar {} is named twice", s.name)));
        }
        image_reference(&s.image)?;
        if let Some(argv) = &s.command {
            entrypoint(argv)?;
        }
        env(&s.env)?;
        let limits = Template {
            cpu: s.cpu,
            memory_mb: s.memory_mb,
            ..Default::default()
        };
        template_limits(&limits)
            .map_err(|e| invalid(format!("sidecar {}: {}", s.name, e.message)))?;
    }
    Ok(())
}

/// `user[:group]`: each part a name or a number, at most 256 bytes, no
/// whitespace, control character, further colon or leading `-`.
pub fn user(spec: &str) -> Result<(), ErrorBody> {
    // Names or numbers as /etc/passwd and /etc/group hold them: no
    // separator, whitespace or control character.
    // Nor a leading `-`: the name reaches argv of the tools that switch
    // users, where `--root-dir=/` or `-h` would read as an option.
    let ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('-')
            && !p
                .chars()
                .any(|c| c == ':' || c.is_whitespace() || c.is_control())
    };
    let valid = spec.len() <= 256
        && match spec.split_once(':') {
            Some((u, g)) => ok(u) && ok(g),
            None => ok(spec),
        };
    if !valid {
        return Err(invalid(format!(
            "user must be user[:group] (names or numbers), not {:?}",
            spec.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// An entrypoint argv: at most 256 arguments of 64 KiB in all, no NUL;
/// a non-empty one names a program.
pub fn entrypoint(argv: &[String]) -> Result<(), ErrorBody> {
    let total: usize = argv.iter().map(String::len).sum();
    if argv.len() > 256 || total > 64 << 10 || argv.iter().any(|a| a.contains('\0')) {
        return Err(invalid(
            "entrypoint: at most 256 arguments, 64 KiB in all, no NUL".into(),
        ));
    }
    if argv.first().is_some_and(String::is_empty) {
        return Err(invalid("entrypoint[0] is empty".into()));
    }
    Ok(())
}

/// A working directory: an absolute path of at most 4096 bytes, no NUL.
pub fn workdir(dir: &str) -> Result<(), ErrorBody> {
    if !dir.starts_with('/') || dir.len() > 4096 || dir.contains('\0') {
        return Err(invalid(format!(
            "workdir must be an absolute path of at most 4096 bytes, not {:?}",
            dir.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

impl ForkRequest {
    /// The fork's own [`labels`], if it brings any.
    pub fn validate(&self) -> Result<(), ErrorBody> {
        labels(&self.labels)
    }
}

impl PoolSpec {
    /// At most [`MAX_REPLICAS`] members.
    pub fn validate(&self) -> Result<(), ErrorBody> {
        if self.replicas > MAX_REPLICAS {
            return Err(invalid(format!("replicas must be at most {MAX_REPLICAS}")));
        }
        Ok(())
    }
}

impl PrepullRequest {
    /// Each reference's syntax and every knob's range.
    pub fn validate(&self) -> Result<(), ErrorBody> {
        let invalid = |m: String| Err(ErrorBody::new(Code::InvalidArgument, m));
        if self.references.is_empty() || self.references.len() > MAX_PREPULL_REFERENCES {
            return invalid(format!(
                "references must name 1 to {MAX_PREPULL_REFERENCES} images"
            ));
        }
        for r in &self.references {
            image_reference(r)?;
        }
        if self
            .images_per_pod
            .is_some_and(|n| n == 0 || n > MAX_PREPULL_IMAGES_PER_POD)
        {
            return invalid(format!(
                "images_per_pod must be 1 to {MAX_PREPULL_IMAGES_PER_POD}"
            ));
        }
        if self
            .max_parallel
            .is_some_and(|n| n == 0 || n > MAX_PREPULL_PARALLEL)
        {
            return invalid(format!("max_parallel must be 1 to {MAX_PREPULL_PARALLEL}"));
        }
        if self
            .timeout_seconds
            .is_some_and(|n| n == 0 || n > MAX_PREPULL_TIMEOUT_SECONDS)
        {
            return invalid(format!(
                "timeout_seconds must be 1 to {MAX_PREPULL_TIMEOUT_SECONDS}"
            ));
        }
        Ok(())
    }
}

impl PullRequest {
    /// A reference a registry can serve ([`registry_reference`]), the tag
    /// to give the image, and the credentials: both or neither.
    pub fn validate(&self) -> Result<(), ErrorBody> {
        registry_reference(&self.reference)?;
        if let Some(tag) = self.tag.as_deref().filter(|t| !t.is_empty()) {
            image_reference(tag)?;
        }
        match (&self.username, &self.password) {
            (None, None) => Ok(()),
            (Some(u), Some(_)) if !u.is_empty() => Ok(()),
            _ => Err(invalid(
                "give both username and password, or neither".to_string(),
            )),
        }
    }
}

/// Longest image reference accepted (Docker's own limit on a name is 255).
pub const MAX_IMAGE_REF: usize = 255;

/// An image reference: `name[:tag]`, `name@sha256:<hex>` or an image id
/// `sha256:<hex>`, in the character set registries use. Checked the same
/// on both backends; it never names a file.
pub fn image_reference(r: &str) -> Result<(), ErrorBody> {
    let ok = !r.is_empty()
        && r.len() <= MAX_IMAGE_REF
        && r.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b))
        && !r.contains("..")
        && !r.contains("//")
        && !r.ends_with([':', '/', '@']);
    if ok {
        return Ok(());
    }
    Err(invalid(format!(
        "image reference `{}` must be 1-{MAX_IMAGE_REF} of [A-Za-z0-9._-/:@], like `name:tag`",
        r.chars().take(80).collect::<String>()
    )))
}

/// An [`image_reference`] a registry can serve: not an image id
/// (`sha256:<hex>`, which names an image in a store), and in the
/// distribution reference grammar the registry client parses (lower-case
/// repository path components, a tag of at most 128 word characters, a
/// digest of an algorithm and at least 32 hex digits), so a reference the
/// client would refuse is a 400 here, before a pull's stream starts.
pub fn registry_reference(r: &str) -> Result<(), ErrorBody> {
    image_reference(r)?;
    let id = r.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    });
    if id {
        return Err(invalid(format!(
            "`{r}` is an image id, not a reference a registry can serve"
        )));
    }
    reference_grammar(r).map_err(|why| invalid(format!("image reference `{r}`: {why}")))
}

/// `[domain/]path[:tag][@digest]` as the OCI distribution spec defines it
/// (the name's limit of 255 holds: [`MAX_IMAGE_REF`] bounds the whole).
fn reference_grammar(r: &str) -> Result<(), &'static str> {
    let (rest, digest) = match r.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (r, None),
    };
    // A tag follows the last ':' after the last '/' (a ':' before it is a
    // registry's port).
    let last_slash = rest.rfind('/').map_or(0, |at| at + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(at) => (&rest[..last_slash + at], Some(&rest[last_slash + at + 1..])),
        None => (rest, None),
    };
    let mut parts = name.split('/').peekable();
    let first = parts.peek().copied().unwrap_or_default();
    // The first component names a registry when it looks like a host
    // (a dot, a port, `localhost`), as every client decides it.
    if name.contains('/') && (first.contains(['.', ':']) || first == "localhost") {
        parts.next();
        registry_host(first)?;
    }
    for component in parts {
        path_component(component)?;
    }
    if let Some(tag) = tag {
        let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && tag.bytes().next().is_some_and(word)
            && tag.bytes().all(|b| word(b) || b == b'.' || b == b'-');
        if !ok {
            return Err("a tag is 1-128 of [A-Za-z0-9_.-], starting with a letter, digit or _");
        }
    }
    if let Some(digest) = digest {
        let ok = digest.split_once(':').is_some_and(|(algorithm, hex)| {
            algorithm
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic())
                && algorithm
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+._-".contains(&b))
                && hex.len() >= 32
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        });
        if !ok {
            return Err("a digest is `algorithm:hex`, with at least 32 hex digits");
        }
    }
    Ok(())
}

/// A registry `host[:port]`: dot-separated labels of letters, digits and
/// inner hyphens.
fn registry_host(domain: &str) -> Result<(), &'static str> {
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    let label = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !host.split('.').all(label) {
        return Err("the registry host must be dot-separated letters, digits and inner hyphens");
    }
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return Err("the registry port must be digits");
    }
    Ok(())
}

/// A repository path component: lower-case letters and digits, joined by
/// one `.` or `_`, two `_`, or any run of `-`.
fn path_component(c: &str) -> Result<(), &'static str> {
    const WHY: &str = "a repository path is lower-case letters and digits, joined by `.`, `_`, \
                       `__` or runs of `-`";
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return Err(WHY);
    };
    if !alnum(first) || !alnum(last) {
        return Err(WHY);
    }
    let mut at = 0;
    while at < bytes.len() {
        if alnum(bytes[at]) {
            at += 1;
            continue;
        }
        let start = at;
        while at < bytes.len() && !alnum(bytes[at]) {
            at += 1;
        }
        let sep = &c[start..at];
        let ok = matches!(sep, "." | "_" | "__") || sep.bytes().all(|b| b == b'-');
        if !ok {
            return Err(WHY);
        }
    }
    Ok(())
}

/// `name` as `name:latest`; a reference with a tag, a digest or an id as
/// it is.
pub fn normalize_image_reference(r: &str) -> String {
    let last = r.rsplit('/').next().unwrap_or(r);
    if r.contains('@') || last.contains(':') {
        r.to_string()
    } else {
        format!("{r}:latest")
    }
}

/// A `network` field: well-formed patterns (each list at most
/// [`crate::network::MAX_NETWORK_ENTRIES`]), and lists only with `egress`.
pub fn network(spec: &NetworkSpec) -> Result<(), ErrorBody> {
    parse_network(spec).map(|_| ())
}

/// The parsed lists of a valid `network` (allow, deny).
pub fn parse_network(spec: &NetworkSpec) -> Result<(Vec<Pattern>, Vec<Pattern>), ErrorBody> {
    if spec.mode != Network::Egress && !spec.is_plain() {
        return Err(invalid(
            "network: allow_out and deny_out apply to mode `egress` only".into(),
        ));
    }
    let allow = parse_list("network.allow_out", &spec.allow_out).map_err(invalid)?;
    let deny = parse_list("network.deny_out", &spec.deny_out).map_err(invalid)?;
    Ok((allow, deny))
}

/// Whether a create request's `network` only narrows its template's:
///
/// - `none` narrows anything (the sandbox goes offline);
/// - otherwise the mode must be the template's (`host` stays `host`,
///   `egress` stays `egress`);
/// - every `allow_out` entry of the request must be covered by one entry
///   of the template's allow list ([`Pattern::covers`]: same or narrower
///   target, and the same port unless the template's entry has none). An
///   empty template list stands for the operator's default: `*` when
///   `default_allows_all`, nothing otherwise;
/// - `deny_out` entries only take away, so any valid ones are fine.
///
/// The gateway enforces the template's and the request's lists both (a
/// flow must pass each), so this check is what makes a widening a `400`
/// rather than a silent no-op.
pub fn narrow_network(
    template: &NetworkSpec,
    request: &NetworkSpec,
    default_allows_all: bool,
) -> Result<(), ErrorBody> {
    let (req_allow, _) = parse_network(request)?;
    if request.mode == Network::None {
        return Ok(());
    }
    if request.mode != template.mode {
        return Err(invalid(format!(
            "network: mode `{}` would widen the template's `{}` (a sandbox may only narrow it, or pick `none`)",
            mode_name(request.mode),
            mode_name(template.mode)
        )));
    }
    let (mut tpl_allow, _) = parse_network(template)?;
    if tpl_allow.is_empty() && default_allows_all {
        tpl_allow.push(Pattern {
            target: Target::Any,
            port: None,
            proto: Default::default(),
        });
    }
    for (i, (entry, pattern)) in request.allow_out.iter().zip(&req_allow).enumerate() {
        if !tpl_allow.iter().any(|t| t.covers(pattern)) {
            return Err(invalid(format!(
                "network.allow_out[{i}] {entry:?} is not within the template's allow_out: a sandbox may narrow its template's network, never widen it"
            )));
        }
    }
    Ok(())
}

fn mode_name(m: Network) -> &'static str {
    crate::network::mode_word(m)
}

/// A `POST /v1/volumes` body: the name (a DNS-1123 label, as template
/// and pool names, so it is one path component on every backend), the
/// size within [`crate::volumes::MIN_VOLUME_MB`]..=
/// [`crate::volumes::MAX_VOLUME_MB`], and the labels.
pub fn volume(v: &crate::volumes::CreateVolume) -> Result<(), ErrorBody> {
    use crate::volumes::{MAX_VOLUME_MB, MIN_VOLUME_MB};
    name("volume", &v.name)?;
    if !(MIN_VOLUME_MB..=MAX_VOLUME_MB).contains(&v.size_mb) {
        return Err(invalid(format!(
            "size_mb {} must be within {MIN_VOLUME_MB}..={MAX_VOLUME_MB}",
            v.size_mb
        )));
    }
    if let Some(from) = &v.from_snapshot {
        let Some((volume, snapshot)) = from.parts() else {
            return Err(invalid(
                "from_snapshot must be \"volume@snapshot\" or {\"volume\", \"snapshot\"}"
                    .to_string(),
            ));
        };
        name("volume", volume)?;
        name("snapshot", snapshot)?;
    }
    labels(&v.labels)
}

/// Paths a volume may not be mounted at, nor above, nor below: the
/// sandbox's kernel filesystems and the runtime's own mounts (`/` itself is
/// refused as every path's parent).
pub const RESERVED_MOUNT_PATHS: &[&str] = &["/proc", "/dev", "/sys", "/.sandhub"];

/// Where the workspace is: a volume may be mounted below it, never on it.
pub const WORKSPACE_ROOT: &str = "/workspace";

/// A sandbox's volume mounts: at most [`crate::volumes::MAX_VOLUME_MOUNTS`];
/// each a volume name and a path that is absolute and normalized (no
/// `.`, `..`, empty component or trailing `/`), not `/`, not at, above or
/// below a [`RESERVED_MOUNT_PATHS`] entry, not [`WORKSPACE_ROOT`] itself
/// (nor above it), and neither at, above nor below another mount of the
/// same list (nested mounts would depend on their order). A volume may
/// appear twice (at two paths). Each refusal is `400 INVALID_ARGUMENT`
/// naming the entry (`volumes[1] "/proc": ...`).
pub fn volume_mounts(mounts: &[crate::volumes::VolumeMount]) -> Result<(), ErrorBody> {
    use crate::volumes::{MAX_MOUNT_PATH, MAX_VOLUME_MOUNTS};
    if mounts.len() > MAX_VOLUME_MOUNTS {
        return Err(invalid(format!("at most {MAX_VOLUME_MOUNTS} volumes")));
    }
    /// `a` is `b` or lies below it.
    fn within(a: &str, b: &str) -> bool {
        a == b || (a.starts_with(b) && a.as_bytes().get(b.len()) == Some(&b'/'))
    }
    for (i, m) in mounts.iter().enumerate() {
        let at = |why: String| invalid(format!("volumes[{i}] {:?}: {why}", m.path));
        name("volume", &m.name).map_err(|e| invalid(format!("volumes[{i}]: {}", e.message)))?;
        let p = m.path.as_str();
        if p.len() > MAX_MOUNT_PATH {
            return Err(at(format!("a path is at most {MAX_MOUNT_PATH} bytes")));
        }
        if !p.starts_with('/') {
            return Err(at("the path must be absolute".into()));
        }
        if p == "/" {
            return Err(at("a volume cannot be the sandbox's root".into()));
        }
        let normal = p[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
        if !normal || p.chars().any(|c| c.is_control()) {
            return Err(at(
                "the path must be normalized: no `.`, `..`, empty component, trailing `/` or control character".into(),
            ));
        }
        for r in RESERVED_MOUNT_PATHS {
            if within(p, r) || within(r, p) {
                return Err(at(format!(
                    "{r} is the runtime's; a volume may not be at, above or below it"
                )));
            }
        }
        if within(WORKSPACE_ROOT, p) {
            return Err(at(format!(
                "a volume may be mounted below {WORKSPACE_ROOT}, not on it nor above it"
            )));
        }
        for (j, other) in mounts[..i].iter().enumerate() {
            if within(p, &other.path) || within(&other.path, p) {
                return Err(at(format!(
                    "overlaps volumes[{j}] {:?}: mounts may not be at, above or below each other",
                    other.path
                )));
            }
        }
    }
    Ok(())
}

mod secrets;
pub use secrets::{merge_secrets, secret_hosts, secret_name, secret_ref, secret_value, secrets};

#[cfg(test)]
mod tests;
