//! Rewards and termination: each matcher looks at one step (its output,
//! a workspace file, or a verify command the hub runs itself).

use regex::Regex;
use sandhub_api::{
    error::Code,
    gym::{Matcher, Stream, When},
    hub::{Command, ExecRequest},
};
use sandhub_client::{read_to_vec, Error, Result, Sandboxes};

/// A matcher with its regular expression compiled once, at env creation.
pub enum Compiled {
    Plain(Matcher),
    Regex {
        re: Regex,
        stream: Stream,
        weight: f64,
    },
}

/// What one action produced.
pub struct StepOutput<'a> {
    pub exit_code: Option<i32>,
    pub stdout: &'a str,
    pub stderr: &'a str,
}

const DEFAULT_VERIFY_TIMEOUT: f64 = 300.0;

pub fn compile(m: Matcher) -> Result<Compiled> {
    let weight_of = |w: f64| {
        if w.is_finite() {
            Ok(())
        } else {
            Err(Error::invalid("matcher weights must be finite numbers"))
        }
    };
    match m {
        Matcher::Regex {
            pattern,
            stream,
            weight,
        } => {
            weight_of(weight)?;
            // Output is lines: `^` and `$` match at line boundaries, so
            // `^3$` matches "3\n" as a Python `re.M` search would.
            let re = regex::RegexBuilder::new(&pattern)
                .multi_line(true)
                .size_limit(1 << 20)
                .build()
                .map_err(|e| Error::invalid(format!("regex {pattern:?}: {e}")))?;
            Ok(Compiled::Regex { re, stream, weight })
        }
        Matcher::File {
            ref path,
            ref equals,
            ref contains,
            weight,
        } => {
            weight_of(weight)?;
            if path.is_empty() || (equals.is_none() && contains.is_none()) {
                return Err(Error::invalid(
                    "a file matcher needs a path and `equals` or `contains`",
                ));
            }
            Ok(Compiled::Plain(m))
        }
        Matcher::Command {
            ref command,
            weight,
            timeout_seconds,
            ..
        } => {
            weight_of(weight)?;
            if command.trim().is_empty() {
                return Err(Error::invalid("a command matcher needs a command"));
            }
            sandhub_api::limits::optional_timeout("timeout_seconds", timeout_seconds)?;
            Ok(Compiled::Plain(m))
        }
        Matcher::ExitCode { weight, .. } => {
            weight_of(weight)?;
            Ok(Compiled::Plain(m))
        }
    }
}

impl Compiled {
    pub fn weight(&self) -> f64 {
        match self {
            Compiled::Regex { weight, .. } => *weight,
            Compiled::Plain(
                Matcher::ExitCode { weight, .. }
                | Matcher::File { weight, .. }
                | Matcher::Command { weight, .. }
                | Matcher::Regex { weight, .. },
            ) => *weight,
        }
    }

    /// Whether this matcher only counts on the step that ends an episode.
    pub fn only_at_end(&self) -> bool {
        matches!(
            self,
            Compiled::Plain(Matcher::Command {
                when: When::End,
                ..
            })
        )
    }

    /// Whether the condition holds for this step.
    pub async fn holds<S: Sandboxes + ?Sized>(
        &self,
        sandboxes: &S,
        sandbox: &str,
        env: &std::collections::BTreeMap<String, String>,
        out: &StepOutput<'_>,
    ) -> Result<bool> {
        Ok(match self {
            Compiled::Regex { re, stream, .. } => match stream {
                Stream::Stdout => re.is_match(out.stdout),
                Stream::Stderr => re.is_match(out.stderr),
                Stream::Output => re.is_match(out.stdout) || re.is_match(out.stderr),
            },
            Compiled::Plain(Matcher::ExitCode { equals, .. }) => out.exit_code == Some(*equals),
            Compiled::Plain(Matcher::File {
                path,
                equals,
                contains,
                ..
            }) => match read_to_vec(sandboxes, sandbox, path).await {
                Ok(bytes) => {
                    let text = String::from_utf8_lossy(&bytes);
                    equals.as_ref().is_none_or(|e| text == e.as_str())
                        && contains.as_ref().is_none_or(|c| text.contains(c.as_str()))
                }
                Err(e) if e.code == Code::NotFound || e.code == Code::Conflict => false,
                Err(e) => return Err(e),
            },
            Compiled::Plain(Matcher::Command {
                command,
                timeout_seconds,
                ..
            }) => {
                // A separate process whose exit code alone decides: nothing
                // the agent printed or left running can stand in for it.
                let result = sandboxes
                    .exec(
                        sandbox,
                        ExecRequest {
                            command: Command::Shell(command.clone()),
                            env: env.clone(),
                            cwd: String::new(),
                            timeout_seconds: Some(
                                timeout_seconds.unwrap_or(DEFAULT_VERIFY_TIMEOUT),
                            ),
                            stdin: String::new(),
                            container: None,
                        },
                    )
                    .await?;
                result.exit_code == 0 && !result.timed_out
            }
            Compiled::Plain(Matcher::Regex { .. }) => unreachable!("regexes are compiled"),
        })
    }
}
