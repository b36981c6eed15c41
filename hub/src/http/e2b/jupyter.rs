//! E2B's code-interpreter protocol (`E2b-Sandbox-Port: 49999`), answered
//! by the sandbox's own kernels (sandboxd's code contexts, issue #33)
//! through `crate::code`, so `e2b_code_interpreter` and
//! `@e2b/code-interpreter` run unmodified: `POST /execute` streams E2B's
//! NDJSON lines (`stdout`/`stderr` with a timestamp, `result` with the
//! short MIME names, `error` with the traceback as one string,
//! `number_of_executions`, `end_of_execution`), and `/contexts` creates,
//! lists, restarts and deletes contexts.

use std::collections::BTreeMap;

use axum::{
    body::{Body, Bytes},
    extract::Path,
    http::{header, Method, StatusCode},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
    Extension, Json, Router,
};
use futures::StreamExt;
use sandhub_api::{
    code::{CodeEvent, Context, ContextList, CreateContext, ExecuteCode, CONTEXTS_ROUTE},
    error::Code,
};
use sandhub_client::Error;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{files::rest_error, gone, Envd};
use crate::code::{ask, check, execute};

/// The port E2B's SDKs send code-interpreter calls to.
pub const JUPYTER_PORT: u16 = 49999;

pub fn routes() -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/execute", post(run))
        .route("/contexts", get(list).post(create))
        .route("/contexts/{id}/restart", post(restart))
        .route("/contexts/{id}", delete(remove))
        .fallback(|| async {
            rest_error(&Error::new(
                Code::NotFound,
                "no such code-interpreter route",
            ))
        })
        .layer(axum::extract::DefaultBodyLimit::max(
            crate::http::MAX_JSON_BODY,
        ))
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Error> {
    serde_json::from_slice(body)
        .map_err(|e| Error::new(Code::InvalidArgument, format!("request body: {e}")))
}

/// E2B's context: id, language, cwd.
fn context(c: Context) -> Value {
    json!({"id": c.id, "language": c.language, "cwd": c.cwd})
}

async fn sandboxd(envd: &Envd) -> Result<sandhub_client::sandboxd::SandboxdClient, Response> {
    if let Some(r) = gone(envd).await {
        return Err(r);
    }
    envd.api
        .sandboxd(&envd.id, "running code")
        .await
        .map_err(|e| rest_error(&e))
}

#[derive(Deserialize)]
struct ExecuteBody {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

async fn run(Extension(envd): Extension<Envd>, body: Bytes) -> Response {
    let body: ExecuteBody = match parse(&body) {
        Ok(b) => b,
        Err(e) => return rest_error(&e),
    };
    let request = ExecuteCode {
        code: body.code,
        context: body.context_id,
        language: body.language,
        // E2B bounds an execution on the client; ours is the default.
        timeout_seconds: None,
        env: body.env_vars.unwrap_or_default(),
    };
    if let Err(e) = check(&request) {
        return rest_error(&e);
    }
    let client = match sandboxd(&envd).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let events = match execute(&client, &request).await {
        Ok(e) => e,
        Err(e) => return rest_error(&e),
    };
    let lines = events.flat_map(|item| {
        let lines = e2b_lines(item);
        futures::stream::iter(lines.into_iter().map(|v| {
            let mut line = serde_json::to_vec(&v).unwrap_or_default();
            line.push(b'\n');
            Ok::<_, std::convert::Infallible>(Bytes::from(line))
        }))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

/// One of our events as E2B's lines.
fn e2b_lines(item: sandhub_client::Result<CodeEvent>) -> Vec<Value> {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    };
    match item {
        Ok(CodeEvent::Stdout { text }) => {
            vec![json!({"type": "stdout", "text": text, "timestamp": now()})]
        }
        Ok(CodeEvent::Stderr { text }) => {
            vec![json!({"type": "stderr", "text": text, "timestamp": now()})]
        }
        Ok(CodeEvent::Result(r)) => {
            let mut v = json!({"type": "result", "is_main_result": r.is_main_result});
            for (k, val) in [
                ("text", r.text),
                ("html", r.html),
                ("markdown", r.markdown),
                ("png", r.png),
                ("jpeg", r.jpeg),
                ("svg", r.svg),
            ] {
                if let Some(val) = val {
                    v[k] = Value::String(val);
                }
            }
            if let Some(j) = r.json {
                v["json"] = j;
            }
            vec![v]
        }
        Ok(CodeEvent::Error {
            name,
            value,
            traceback,
        }) => vec![json!({"type": "error", "name": name, "value": value,
                            "traceback": traceback.join("\n")})],
        Ok(CodeEvent::End {
            execution_count, ..
        }) => vec![
            json!({"type": "number_of_executions", "execution_count": execution_count}),
            json!({"type": "end_of_execution"}),
        ],
        Err(e) => vec![json!({"type": "error", "name": e.code.as_str(),
                               "value": e.message, "traceback": ""})],
    }
}

#[derive(Deserialize)]
struct CreateBody {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

async fn create(Extension(envd): Extension<Envd>, body: Bytes) -> Response {
    let body: CreateBody = if body.is_empty() {
        CreateBody {
            language: None,
            cwd: None,
        }
    } else {
        match parse(&body) {
            Ok(b) => b,
            Err(e) => return rest_error(&e),
        }
    };
    let req = CreateContext {
        language: body.language,
        cwd: body.cwd,
        env: BTreeMap::new(),
    };
    if let Err(m) = sandhub_api::code::canonical_language(req.language.as_deref()) {
        return rest_error(&Error::new(Code::InvalidArgument, m));
    }
    let client = match sandboxd(&envd).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let body = Bytes::from(serde_json::to_vec(&req).unwrap_or_default());
    match ask::<Context>(&client, Method::POST, CONTEXTS_ROUTE, body).await {
        Ok(Some(c)) => Json(context(c)).into_response(),
        Ok(None) => rest_error(&Error::unavailable("no context in the answer")),
        Err(e) => rest_error(&e),
    }
}

async fn list(Extension(envd): Extension<Envd>) -> Response {
    let client = match sandboxd(&envd).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    match ask::<ContextList>(&client, Method::GET, CONTEXTS_ROUTE, Bytes::new()).await {
        Ok(list) => {
            let all: Vec<Value> = list
                .map(|l| l.contexts.into_iter().map(context).collect())
                .unwrap_or_default();
            Json(all).into_response()
        }
        Err(e) => rest_error(&e),
    }
}

fn context_route(id: &str, tail: &str) -> Result<String, Error> {
    sandhub_api::code::check_context_id(id).map_err(|m| Error::new(Code::InvalidArgument, m))?;
    Ok(format!("{CONTEXTS_ROUTE}/{id}{tail}"))
}

async fn restart(Extension(envd): Extension<Envd>, Path(id): Path<String>) -> Response {
    let route = match context_route(&id, "/restart") {
        Ok(r) => r,
        Err(e) => return rest_error(&e),
    };
    let client = match sandboxd(&envd).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    match ask::<Context>(&client, Method::POST, &route, Bytes::new()).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => rest_error(&e),
    }
}

async fn remove(Extension(envd): Extension<Envd>, Path(id): Path<String>) -> Response {
    let route = match context_route(&id, "") {
        Ok(r) => r,
        Err(e) => return rest_error(&e),
    };
    let client = match sandboxd(&envd).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    match ask::<Value>(&client, Method::DELETE, &route, Bytes::new()).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => rest_error(&e),
    }
}
