// A shell in the sandbox: xterm over the hub's PTY WebSocket. A browser
// cannot put the API key on a WebSocket, so a single-use ticket minted
// with the key (POST .../pty-tickets) opens it; the key never enters a URL.
// The shell is opened with `keep=true`: the hub keeps it for a while when
// the socket drops, and this tab remembers its id (`shell.ts`), so that
// after a reload the terminal re-attaches to the same shell, its recent
// output replayed. A shell that is gone meanwhile gets a new one.
import { useEffect, useRef, useState } from "preact/hooks";
import { Terminal as Xterm } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";
import { call, enc } from "../api";
import { message } from "../format";
import { keepShell, keptShell } from "./shell";

type Status = "connecting" | "open" | "closed";

export default function Terminal(props: { id: string }) {
  const el = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState<Status>("connecting");
  const [note, setNote] = useState<string>("");
  const [attempt, setAttempt] = useState(0);

  useEffect(() => {
    if (!el.current) return;
    const term = new Xterm({ convertEol: false, cursorBlink: true, fontSize: 13, scrollback: 2000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(el.current);
    fit.fit();
    let ws: WebSocket | null = null;
    let gone = false;
    const sendSize = () => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ cols: term.cols, rows: term.rows }));
    };
    const onResize = () => {
      fit.fit();
      sendSize();
    };
    const connect = async (shell: string | null, retried = false) => {
      try {
        const { ticket } = await call<{ ticket: string }>("POST", `/v1/sandboxes/${enc(props.id)}/pty-tickets`);
        if (gone) return;
        const scheme = location.protocol === "https:" ? "wss" : "ws";
        const q = new URLSearchParams({ cols: String(term.cols), rows: String(term.rows), keep: "true", ticket });
        if (shell) q.set("shell", shell);
        const sock = new WebSocket(`${scheme}://${location.host}/v1/sandboxes/${enc(props.id)}/pty?${q}`);
        ws = sock;
        let opened = false;
        sock.binaryType = "arraybuffer";
        sock.onopen = () => {
          opened = true;
          setStatus("open");
          if (shell) setNote("re-attached");
          // A re-attached shell still has the size of the last window.
          sendSize();
          term.focus();
        };
        sock.onmessage = (m) => {
          if (m.data instanceof ArrayBuffer) term.write(new Uint8Array(m.data));
          else {
            try {
              const said = JSON.parse(m.data as string) as { exit_code?: number; shell?: string };
              if (typeof said.shell === "string") keepShell(props.id, said.shell);
              if (said.exit_code !== undefined) {
                keepShell(props.id, null);
                setNote(`exited with ${said.exit_code}`);
              }
            } catch {
              /* not ours */
            }
          }
        };
        sock.onclose = () => {
          if (gone || ws !== sock) return;
          if (!opened && shell) {
            // Just reloaded, the hub may not have seen the old socket go
            // yet: one more try. Then the shell is gone (it ended, or its
            // grace ran out): a new one.
            if (!retried) {
              setTimeout(() => void connect(shell, true), 1000);
              return;
            }
            keepShell(props.id, null);
            void connect(null);
            return;
          }
          setStatus("closed");
        };
      } catch (e) {
        setNote(message(e));
        setStatus("closed");
      }
    };
    void connect(keptShell(props.id));
    const encoder = new TextEncoder();
    const input = term.onData((d) => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(encoder.encode(d));
    });
    const resized = term.onResize(sendSize);
    addEventListener("resize", onResize);
    return () => {
      gone = true;
      removeEventListener("resize", onResize);
      input.dispose();
      resized.dispose();
      ws?.close();
      term.dispose();
    };
  }, [props.id, attempt]);

  return (
    <div>
      <div class="row">
        <span role="status" data-testid="terminal-status">
          {status}
          {note && ` · ${note}`}
        </span>
        {status === "closed" && (
          <button
            onClick={() => {
              setNote("");
              setStatus("connecting");
              setAttempt((a) => a + 1);
            }}
          >
            Reconnect
          </button>
        )}
      </div>
      <div class="terminal" ref={el} aria-label="Terminal" />
    </div>
  );
}
