// Which kept shell this tab's terminal had in a sandbox, so that a reload
// re-attaches to it (the hub keeps a dropped terminal's shell for 60 s).
// In sessionStorage, like the key: this tab only. Not a secret: the hub
// hands a shell back only to its own tenant, with a fresh ticket.
const PREFIX = "sandhub.shell.";

export function keptShell(sandbox: string): string | null {
  return sessionStorage.getItem(PREFIX + sandbox);
}

export function keepShell(sandbox: string, shell: string | null): void {
  if (shell === null) sessionStorage.removeItem(PREFIX + sandbox);
  else sessionStorage.setItem(PREFIX + sandbox, shell);
}
