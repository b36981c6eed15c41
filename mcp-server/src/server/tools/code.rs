//! `run_code`: a cell run in the sandbox's code interpreter (issue #33).
//! Text goes back as text; each PNG or SVG result also as MCP image
//! content, so a multimodal model sees its own chart.

use base64::Engine;
use futures::StreamExt;
use rmcp::{
    handler::server::wrapper::Parameters,
    model::{CallToolResult, ContentBlock as Content},
    tool, tool_router,
};
use sandhub_api::code::{CodeEvent, ExecuteCode};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{bounded, seconds};
use crate::{
    errors::ToolError,
    output::truncate_middle,
    provider::SandboxesProvider,
    server::{Hub, SandhubMcp},
};

const DEFAULT_TIMEOUT: f64 = 60.0;
/// Past the cell's own timeout (which interrupts it), how long to wait.
const GRACE_SECONDS: f64 = 30.0;
/// Images returned per call, at most (each is up to the result cap).
const MAX_IMAGES: usize = 8;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunCodeParams {
    /// The sandbox id that create_sandbox returned. Its template's image
    /// needs a kernel (e.g. code-interpreter-v1).
    pub sandbox_claim_name: String,
    /// Python code. Variables and imports persist between calls in the same context.
    pub code: String,
    /// A context id from the REST API; default: the language's default context.
    #[serde(default)]
    pub context: Option<String>,
    /// `python` (the default) or `bash`.
    #[serde(default)]
    pub language: Option<String>,
    /// Seconds before the cell is interrupted (the context stays). Default 60.
    #[serde(default)]
    pub timeout: Option<f64>,
}

/// The same as the content blocks, as data (images counted, not repeated).
#[derive(Debug, Default, Serialize, JsonSchema)]
pub struct RunCodeResult {
    pub stdout: String,
    pub stderr: String,
    /// The text of each result (`text/plain`, else `text/markdown`), in order.
    pub results: Vec<String>,
    /// The cell's error (`TimeoutError` when it was interrupted, `KernelDied`
    /// when its kernel exited), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub execution_count: u64,
    /// How many PNG/SVG results follow as image content.
    pub images: usize,
}

#[tool_router(router = code_router, vis = "pub(crate)")]
impl<P: SandboxesProvider> SandhubMcp<P> {
    #[tool(
        description = "Run Python (or bash, with language) in a stateful kernel in a sandbox \
        (variables and imports persist between calls): returns stdout, stderr, the value of the last expression, \
        errors with tracebacks, and each matplotlib chart or other PNG/SVG result as an image. \
        A timeout interrupts the cell and keeps the context.",
        annotations(
            title = "Run code",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        ),
        output_schema = rmcp::handler::server::common::schema_for_output::<RunCodeResult>()
    )]
    pub async fn run_code(
        &self,
        Parameters(p): Parameters<RunCodeParams>,
        hub: Hub,
    ) -> Result<CallToolResult, ToolError> {
        let timeout = seconds("timeout", p.timeout, DEFAULT_TIMEOUT)?;
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let request = ExecuteCode {
            code: p.code,
            context: p.context,
            language: p.language,
            timeout_seconds: Some(timeout.ceil() as u64),
            env: Default::default(),
        };
        let cap = self.options.max_output_bytes;
        let events = bounded("the code", timeout + GRACE_SECONDS, async {
            let mut stream = sb
                .run_code(&id, request)
                .await
                .map_err(|e| self.gone_or(&id, e))?;
            let mut events = Vec::new();
            let mut size = 0usize;
            while let Some(e) = stream.next().await {
                let e = e.map_err(|e| self.gone_or(&id, e))?;
                // Text beyond a few caps is never shown: stop keeping it.
                if let CodeEvent::Stdout { text } | CodeEvent::Stderr { text } = &e {
                    size += text.len();
                    if size > 4 * cap {
                        continue;
                    }
                }
                events.push(e);
            }
            Ok(events)
        })
        .await?;
        let (data, content) = shape(events, cap);
        let mut result = CallToolResult::success(content);
        result.structured_content = serde_json::to_value(data).ok();
        Ok(result)
    }
}

/// The events as content: one text block (output, values, errors), then
/// the images.
fn shape(events: Vec<CodeEvent>, cap: usize) -> (RunCodeResult, Vec<Content>) {
    let mut data = RunCodeResult::default();
    let (mut stdout, mut stderr, mut text) = (String::new(), String::new(), Vec::new());
    let mut images = Vec::new();
    let b64 = base64::engine::general_purpose::STANDARD;
    for e in events {
        match e {
            CodeEvent::Stdout { text: t } => stdout.push_str(&t),
            CodeEvent::Stderr { text: t } => stderr.push_str(&t),
            CodeEvent::Result(r) => {
                if let Some(png) = r.png.clone().filter(|_| images.len() < MAX_IMAGES) {
                    images.push(Content::image(png, "image/png"));
                } else if let Some(svg) = r.svg.clone().filter(|_| images.len() < MAX_IMAGES) {
                    images.push(Content::image(b64.encode(svg), "image/svg+xml"));
                }
                if let Some(t) = r.text.or(r.markdown) {
                    data.results
                        .push(truncate_middle(&t, cap).unwrap_or_else(|| t.clone()));
                    let label = if r.is_main_result {
                        "result"
                    } else {
                        "display"
                    };
                    text.push(format!("[{label}]\n{t}"));
                }
            }
            CodeEvent::Error {
                name,
                value,
                traceback,
            } => {
                let tb = strip_ansi(&traceback.join("\n"));
                let tb = truncate_middle(&tb, cap).unwrap_or(tb);
                let e = format!("{name}: {value}\n{tb}");
                text.push(format!("[error] {e}"));
                data.error = Some(e);
            }
            CodeEvent::End {
                execution_count,
                dropped,
                ..
            } => {
                data.execution_count = execution_count;
                let mut end = format!("[end] execution_count={execution_count}");
                if dropped > 0 {
                    end.push_str(&format!(" ({dropped} output messages lost to a flood)"));
                }
                text.push(end);
            }
        }
    }
    let mut body = Vec::new();
    data.stdout = truncate_middle(&stdout, cap).unwrap_or(stdout);
    data.stderr = truncate_middle(&stderr, cap).unwrap_or(stderr);
    for (name, s) in [("stdout", &data.stdout), ("stderr", &data.stderr)] {
        if !s.is_empty() {
            body.push(format!("[{name}]\n{s}"));
        }
    }
    body.extend(text);
    data.images = images.len();
    let mut content = vec![Content::text(body.join("\n"))];
    content.extend(images);
    (data, content)
}

/// Tracebacks come colored for a terminal; a model reads them plain.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use sandhub_api::code::ResultBundle;

    use super::*;

    #[test]
    fn a_png_is_an_image_and_text_is_text() {
        let events = vec![
            CodeEvent::Stdout {
                text: "hi\n".into(),
            },
            CodeEvent::Result(ResultBundle {
                text: Some("<Figure>".into()),
                png: Some("iVBORw0KGgo=".into()),
                ..Default::default()
            }),
            CodeEvent::Error {
                name: "ZeroDivisionError".into(),
                value: "division by zero".into(),
                traceback: vec!["\u{1b}[0;31mZeroDivisionError\u{1b}[0m".into()],
            },
            CodeEvent::End {
                execution_count: 3,
                duration: 0.1,
                dropped: 0,
            },
        ];
        let (data, content) = shape(events, 1024);
        assert_eq!((data.images, data.execution_count), (1, 3));
        assert_eq!(content.len(), 2);
        let text = content[0].as_text().unwrap().text.clone();
        assert!(
            text.contains("[stdout]\nhi") && text.contains("ZeroDivisionError: division by zero")
        );
        assert!(!text.contains('\u{1b}'), "{text}");
        let image = content[1].as_image().unwrap();
        assert_eq!(image.mime_type, "image/png");
    }
}
