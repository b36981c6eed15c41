// The hub's public API, as any client sees it. The key the user signed in
// with lives in sessionStorage (this tab only, gone when it closes) and is
// sent as a header: never in a URL, never in a cookie.

const KEY = "sandhub.api-key";

export function storedKey(): string | null {
  return sessionStorage.getItem(KEY);
}

export function storeKey(key: string | null): void {
  if (key === null) sessionStorage.removeItem(KEY);
  else sessionStorage.setItem(KEY, key);
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const key = storedKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function failure(r: Response): Promise<ApiError> {
  try {
    const body = (await r.json()) as { code?: string; message?: string };
    return new ApiError(r.status, body.code ?? "UNKNOWN", body.message ?? r.statusText);
  } catch {
    return new ApiError(r.status, "UNKNOWN", r.statusText);
  }
}

/** A JSON call; `body` is sent as JSON. */
export async function call<T>(method: string, path: string, body?: unknown): Promise<T> {
  const init: RequestInit = { method, headers: headers(), credentials: "omit" };
  if (body !== undefined) {
    init.headers = headers({ "Content-Type": "application/json" });
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (!r.ok) throw await failure(r);
  if (r.status === 204) return undefined as T;
  return (await r.json()) as T;
}

/** Raw bytes in or out (files). */
export async function raw(method: string, path: string, body?: Blob): Promise<Response> {
  const r = await fetch(path, {
    method,
    headers: headers(body ? { "Content-Type": "application/octet-stream" } : {}),
    credentials: "omit",
    body,
  });
  if (!r.ok) throw await failure(r);
  return r;
}

/** Server-Sent Events read with fetch (EventSource cannot send a header).
 *  Calls `onEvent` per event until `signal` aborts or the stream ends. */
export async function sse(
  path: string,
  signal: AbortSignal,
  onEvent: (type: string, data: string, id: string) => void,
  extra: Record<string, string> = {},
  onOpen?: () => void,
): Promise<void> {
  const r = await fetch(path, {
    headers: headers({ ...extra, Accept: "text/event-stream" }),
    signal,
    credentials: "omit",
  });
  if (!r.ok || !r.body) throw await failure(r);
  onOpen?.();
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    // A server that never ends an event must not grow this without bound.
    if (buffer.length > 1 << 20) throw new ApiError(0, "RESOURCE_EXHAUSTED", "event too large");
    let end: number;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let type = "message";
      let id = "";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
        else if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("id:")) id = line.slice(3).trim();
      }
      if (data.length) onEvent(type, data.join("\n"), id);
    }
  }
}

/** A POST whose answer is NDJSON (an image pull): `onLine` gets each
 *  parsed line as it arrives. */
export async function ndjson(path: string, body: unknown, onLine: (line: unknown) => void): Promise<void> {
  const r = await fetch(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    credentials: "omit",
    body: JSON.stringify(body),
  });
  if (!r.ok || !r.body) throw await failure(r);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    if (buffer.length > 1 << 20) throw new ApiError(0, "RESOURCE_EXHAUSTED", "line too long");
    let end: number;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end).trim();
      buffer = buffer.slice(end + 1);
      if (line) onLine(JSON.parse(line));
    }
  }
}

export const enc = encodeURIComponent;

export interface Usage {
  latest: { timestamp: string; cpu_cores: number; memory_bytes: number; pids: number; disk_bytes?: number | null };
  memory_peak_bytes: number;
  limits: Limits;
}
export interface Limits {
  memory_mb?: number | null;
  disk_mb?: number | null;
  cpu?: number | null;
  pids?: number | null;
}
export interface Sandbox {
  id: string;
  template: string;
  state: string;
  labels: Record<string, string>;
  created_at: string;
  pool?: string | null;
  entrypoint?: { state: string; exit_code?: number | null; signal?: number | null; message?: string | null } | null;
  usage?: Usage | null;
}
export interface Sample {
  timestamp: string;
  cpu_cores: number;
  memory_bytes: number;
  pids: number;
  disk_bytes?: number | null;
}
export interface Metrics {
  step_seconds: number;
  limits: Limits;
  samples: Sample[];
}
export interface Pool {
  name: string;
  template: string;
  replicas: number;
  ready: number;
  total: number;
  last_error?: string | null;
}
export interface FileEntry {
  name: string;
  size: number;
  type: string;
  modified_at: string;
  mode: string;
}
export interface Snapshot {
  id: string;
  created_at: string;
  size_bytes?: number | null;
}
