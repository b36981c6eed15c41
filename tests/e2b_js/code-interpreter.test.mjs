// E2B's JavaScript code-interpreter SDK (`@e2b/code-interpreter`, unmodified, pinned in
// package-lock.json) against `sandhub serve --e2b` (issue #33). Run by
// tests/e2b/test_e2b_js_code_interpreter.py, which installs the template and sets
// SANDHUB_E2B_URL and SANDHUB_E2B_KEY; the SDK's control plane and the sandbox's ports are
// both the hub's URL, as for the Python SDK.
import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'

import { Sandbox } from '@e2b/code-interpreter'

const url = process.env.SANDHUB_E2B_URL
const conn = { apiKey: process.env.SANDHUB_E2B_KEY, apiUrl: url, sandboxUrl: url }
let sbx

before(async () => {
  assert.ok(url, 'SANDHUB_E2B_URL names the hub')
  sbx = await Sandbox.create(conn) // the SDK's default template: code-interpreter-v1
})

after(async () => {
  await sbx?.kill()
})

test('state, streamed output, rich results and errors', async () => {
  await sbx.runCode('x = 21')
  assert.equal((await sbx.runCode('x * 2')).text, '42')

  const seen = []
  const hello = await sbx.runCode("print('hello')", { onStdout: (m) => seen.push(m.line) })
  assert.deepEqual(hello.logs.stdout, ['hello\n'])
  assert.deepEqual(seen, ['hello\n'])

  const errors = []
  const failed = await sbx.runCode('1/0', { onError: (e) => errors.push(e) })
  assert.equal(failed.error.name, 'ZeroDivisionError')
  assert.match(failed.error.traceback, /ZeroDivisionError/)
  assert.equal(errors.length, 1)

  const plot = await sbx.runCode(
    'import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=100)\nplt.plot([1, 2, 3])\nplt.show()',
  )
  const png = Buffer.from(plot.results.find((r) => r.png).png, 'base64')
  assert.equal(png.subarray(1, 4).toString(), 'PNG')
  assert.deepEqual([png.readUInt32BE(16), png.readUInt32BE(20)], [300, 200])

  const table = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
  assert.match(table.results[0].html, /<table/)
})

test("a client's timeout interrupts the cell and the context goes on", async () => {
  await sbx.runCode('kept = 7')
  const started = Date.now()
  await assert.rejects(sbx.runCode('while True: pass', { timeoutMs: 1000 }), (e) => e.name === 'TimeoutError')
  assert.ok(Date.now() - started < 30000)
  // The hub saw the client go and interrupted the kernel: the next cell runs at once.
  assert.equal((await sbx.runCode('kept', { timeoutMs: 20000 })).text, '7')
})

test('contexts keep their own variables', async () => {
  const a = await sbx.createCodeContext()
  const b = await sbx.createCodeContext({ language: 'python' })
  await sbx.runCode("v = 'a'", { context: a })
  await sbx.runCode("v = 'b'", { context: b })
  assert.equal((await sbx.runCode('v', { context: a })).text, "'a'")
  assert.equal((await sbx.runCode('v', { context: b })).text, "'b'")
  const ids = (await sbx.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes(a.id) && ids.includes(b.id), ids)
  await sbx.restartCodeContext(a)
  assert.equal((await sbx.runCode("'v' in globals()", { context: a })).text, 'False')
  await sbx.removeCodeContext(b)
  assert.ok(!(await sbx.listCodeContexts()).map((c) => c.id).includes(b.id))
})

test('executions in two contexts run in parallel', async () => {
  const [a, b] = await Promise.all([sbx.createCodeContext(), sbx.createCodeContext()])
  await Promise.all([sbx.runCode('import time', { context: a }), sbx.runCode('import time', { context: b })])
  const started = Date.now()
  const both = await Promise.all([
    sbx.runCode("time.sleep(2); 'a'", { context: a }),
    sbx.runCode("time.sleep(2); 'b'", { context: b }),
  ])
  assert.deepEqual(
    both.map((e) => e.text),
    ["'a'", "'b'"],
  )
  // One after the other would take 4 s or more.
  assert.ok(Date.now() - started < 3500, `${Date.now() - started} ms`)
})
