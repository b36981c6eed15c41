// The Sandhub console: a client of the hub's public API, nothing more.
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { ApiError, call, storeKey, storedKey } from "./api";
import { Sandboxes } from "./views/Sandboxes";
import { Detail } from "./views/Detail";
import { Pools } from "./views/Pools";
import { Events } from "./views/Events";
import { Operators } from "./views/Operators";
import { Templates } from "./views/Templates";
import { Gym } from "./views/Gym";
import "./style.css";

type Access = "checking" | "in" | "out";

function useHash(): string {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const on = () => setHash(location.hash);
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return hash;
}

function SignIn(props: { failed: boolean; onKey: (key: string) => void }) {
  const [key, setKey] = useState("");
  return (
    <main class="signin">
      <h1>Sandhub</h1>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          props.onKey(key.trim());
        }}
      >
        <label for="api-key">API key</label>
        <input
          id="api-key"
          type="password"
          autocomplete="off"
          value={key}
          onInput={(e) => setKey(e.currentTarget.value)}
          required
        />
        <button type="submit">Sign in</button>
        {props.failed && <p role="alert" class="error">That key was not accepted.</p>}
      </form>
      <p class="hint">The key stays in this tab (sessionStorage) and is sent only to this hub, as a header.</p>
    </main>
  );
}

function App() {
  const [access, setAccess] = useState<Access>("checking");
  const [failed, setFailed] = useState(false);
  const [operator, setOperator] = useState(false);
  const hash = useHash();

  const check = async () => {
    try {
      // A hub without keys answers this for anyone: it opens straight in.
      await call("GET", "/v1/pools");
      setAccess("in");
      // Only --admin-tenants get an answer here (others: 404).
      setOperator(await call("GET", "/v1/admin/tenants").then(() => true, () => false));
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) {
        setFailed(storedKey() !== null);
        storeKey(null);
        setAccess("out");
      } else setAccess("in");
    }
  };
  useEffect(() => {
    void check();
  }, []);

  if (access === "checking") return <p class="loading">Loading…</p>;
  if (access === "out")
    return (
      <SignIn
        failed={failed}
        onKey={(key) => {
          storeKey(key);
          void check();
        }}
      />
    );

  const route = hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  let view;
  if (route[0] === "sandboxes" && route[1]) view = <Detail id={route[1]} />;
  else if (route[0] === "pools") view = <Pools />;
  else if (route[0] === "events") view = <Events />;
  else if (route[0] === "templates") view = <Templates />;
  else if (route[0] === "gym") view = <Gym />;
  else if (route[0] === "operators" && operator) view = <Operators />;
  else view = <Sandboxes />;
  const here = route[0] || "sandboxes";
  const link = (to: string, label: string) => (
    <a href={`#/${to}`} aria-current={here === to ? "page" : undefined}>
      {label}
    </a>
  );
  return (
    <>
      <header>
        <strong class="brand">Sandhub</strong>
        <nav aria-label="Main">
          {link("sandboxes", "Sandboxes")}
          {link("pools", "Pools")}
          {link("templates", "Templates")}
          {link("gym", "Gym")}
          {link("events", "Events")}
          {operator && link("operators", "Operators")}
        </nav>
        {storedKey() !== null && (
          <button
            class="link"
            onClick={() => {
              storeKey(null);
              setFailed(false);
              setOperator(false);
              setAccess("out");
            }}
          >
            Sign out
          </button>
        )}
      </header>
      <main>{view}</main>
    </>
  );
}

render(<App />, document.getElementById("app")!);
