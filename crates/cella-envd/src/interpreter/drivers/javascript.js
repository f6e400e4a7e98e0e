// cella's JavaScript driver for the code interpreter (run by cella-envd as `node -e`).
//
// Same protocol as every driver: JSON commands on fd 4, JSON events on fd 3, the cell's output
// on fds 1 and 2 followed by the CELLA_INTERP_MARKER marker, then {"type":"end"}. Cells run in
// one vm context, so globals (and top-level let/const) persist; the completion value of the
// cell is its result (a promise is awaited); SIGINT interrupts a running cell.
'use strict';
const fs = require('fs');
const readline = require('readline');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');
const path = require('path');

const MARKER = process.env.CELLA_INTERP_MARKER || '';
delete process.env.CELLA_INTERP_MARKER;

function emit(event) {
  fs.writeSync(3, JSON.stringify(event) + '\n');
}

const cwd = process.cwd();
const sandbox = {
  console, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
  queueMicrotask, structuredClone, AbortController, AbortSignal, Event, EventTarget,
  require: createRequire(path.join(cwd, '__cella_cell__.js')),
  module: { exports: {} }, __dirname: cwd, __filename: path.join(cwd, '__cella_cell__.js'),
};
for (const name of ['fetch', 'Headers', 'Request', 'Response', 'FormData', 'Blob', 'WebSocket', 'performance', 'crypto']) {
  if (globalThis[name] !== undefined) sandbox[name] = globalThis[name];
}
sandbox.exports = sandbox.module.exports;
sandbox.display = (...values) => {
  for (const v of values) emit({ type: 'result', is_main_result: false, data: { 'text/plain': util.inspect(v) } });
};
const context = vm.createContext(sandbox);

// SIGINT between cells (or while a promise is awaited) must not end the driver.
process.on('SIGINT', () => {});

function errorEvent(e) {
  if (e !== null && typeof e === 'object') {
    return { type: 'error', name: String(e.name || 'Error'), value: String(e.message || ''), traceback: String(e.stack || e) };
  }
  return { type: 'error', name: 'Error', value: String(e), traceback: 'Uncaught ' + util.inspect(e) };
}

function compile(code, filename) {
  try {
    return new vm.Script(code, { filename });
  } catch (e) {
    // Top-level await: run the cell as an async function body instead.
    if (e instanceof SyntaxError && /await/.test(String(e.message)) && /\bawait\b/.test(code)) {
      return new vm.Script('(async () => {\n' + code + '\n})()', { filename });
    }
    throw e;
  }
}

async function runCell(cmd, count) {
  const env = cmd.env_vars || {};
  const saved = {};
  for (const [k, v] of Object.entries(env)) { saved[k] = process.env[k]; process.env[k] = v; }
  try {
    const script = compile(cmd.code || '', `<cell ${count}>`);
    let value = script.runInContext(context, { breakOnSigint: true, displayErrors: false });
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') value = await value;
    if (value !== undefined) {
      emit({ type: 'result', is_main_result: true, data: { 'text/plain': util.inspect(value, { depth: 4 }) } });
    }
  } catch (e) {
    emit(errorEvent(e));
  } finally {
    for (const [k, v] of Object.entries(saved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; }
  }
}

async function main() {
  const rl = readline.createInterface({ input: fs.createReadStream(null, { fd: 4 }), crlfDelay: Infinity });
  emit({ type: 'ready', kernel: 'node' });
  let count = 0;
  for await (const line of rl) {
    let cmd;
    try { cmd = JSON.parse(line); } catch (_) { continue; }
    count += 1;
    emit({ type: 'number_of_executions', execution_count: count });
    await runCell(cmd, count);
    fs.writeSync(1, MARKER);
    fs.writeSync(2, MARKER);
    emit({ type: 'end' });
  }
  process.exit(0);
}

main();
