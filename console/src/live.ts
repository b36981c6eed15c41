// Live updates: one stream of lifecycle events (GET /v1/events) per tab,
// shared by every view that wants to hear of changes. It is read with fetch
// (`sse`), so the key goes as a header, never in a URL; after a drop it
// resumes with `Last-Event-ID`, so an event sent meanwhile still arrives.
// While the stream is down or refused (a backend without an event log
// answers 501, a tenant with too many streams 429), views fall back to
// polling: `useLive` tells them which.
import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, sse } from "./api";

export interface LiveEvent {
  id: number;
  type: string;
  sandbox_id?: string | null;
  pool?: string | null;
}

export type Mode = "live" | "polling";

type Listener = (e: LiveEvent) => void;

/** After a drop, the first retry; doubled up to RETRY_MAX_MS. */
const RETRY_MS = 1000;
const RETRY_MAX_MS = 30_000;
/** How long the stream stays open with nobody listening: moving between
 *  views must not close and reopen it. */
const LINGER_MS = 5000;

const listeners = new Set<Listener>();
const modeListeners = new Set<(m: Mode) => void>();
let mode: Mode = "polling";
let stream: AbortController | null = null;
let lastId = "";
let delay = RETRY_MS;
let retryTimer: ReturnType<typeof setTimeout> | undefined;
let lingerTimer: ReturnType<typeof setTimeout> | undefined;

function setMode(m: Mode): void {
  if (m === mode) return;
  mode = m;
  for (const l of modeListeners) l(m);
}

function open(): void {
  if (stream || retryTimer !== undefined) return;
  const ctl = new AbortController();
  stream = ctl;
  const extra: Record<string, string> = lastId ? { "Last-Event-ID": lastId } : {};
  const onEvent = (type: string, data: string, id: string) => {
    if (id) lastId = id;
    // The hub's last word before it drops a slow reader: we reconnect
    // from lastId below.
    if (type === "error") return;
    let e: LiveEvent;
    try {
      e = JSON.parse(data) as LiveEvent;
    } catch {
      return;
    }
    for (const l of [...listeners]) l(e);
  };
  const onOpen = () => {
    delay = RETRY_MS;
    setMode("live");
  };
  sse("/v1/events", ctl.signal, onEvent, extra, onOpen)
    .catch((e: unknown) => {
      // Refused outright: no quick retry, the views poll meanwhile.
      if (e instanceof ApiError && e.status >= 400) delay = RETRY_MAX_MS;
    })
    .finally(() => {
      if (stream !== ctl) return;
      stream = null;
      setMode("polling");
      if (ctl.signal.aborted || listeners.size === 0) return;
      retryTimer = setTimeout(() => {
        retryTimer = undefined;
        if (listeners.size > 0) open();
      }, delay);
      delay = Math.min(delay * 2, RETRY_MAX_MS);
    });
}

function close(): void {
  stream?.abort();
  stream = null;
  clearTimeout(retryTimer);
  retryTimer = undefined;
  setMode("polling");
}

/** Hears every event of the shared stream while mounted; answers whether
 *  the stream is up ("live") or views should poll ("polling"). */
export function useLive(onEvent: Listener): Mode {
  const [m, setM] = useState<Mode>(mode);
  const handler = useRef(onEvent);
  handler.current = onEvent;
  useEffect(() => {
    const l: Listener = (e) => handler.current(e);
    listeners.add(l);
    modeListeners.add(setM);
    setM(mode);
    clearTimeout(lingerTimer);
    open();
    return () => {
      listeners.delete(l);
      modeListeners.delete(setM);
      if (listeners.size === 0) lingerTimer = setTimeout(close, LINGER_MS);
    };
  }, []);
  return m;
}

/** Calls `fn` at most once per `ms`, trailing: a burst of events (a pool
 *  filling) costs one reload, not one per event. */
export function useCoalesced(fn: () => void, ms = 200): () => void {
  const timer = useRef<ReturnType<typeof setTimeout> | undefined>(undefined);
  const latest = useRef(fn);
  latest.current = fn;
  useEffect(() => () => clearTimeout(timer.current), []);
  return () => {
    if (timer.current !== undefined) return;
    timer.current = setTimeout(() => {
      timer.current = undefined;
      latest.current();
    }, ms);
  };
}
