// Sheepfold JavaScript kernel driver: requests arrive as JSON lines on fd 3,
// messages leave as JSON lines on fd 4; stdout and stderr are the real fds.
'use strict';
const fs = require('fs');
const vm = require('vm');
const util = require('util');
const readline = require('readline');

const MAX_RESULT = 3500000;
const sandbox = {
  console, require, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, setInterval, setImmediate, clearTimeout, clearInterval, clearImmediate,
  queueMicrotask, structuredClone, fetch: globalThis.fetch, module: { exports: {} },
};
sandbox.exports = sandbox.module.exports;
const context = vm.createContext(sandbox);
process.on('SIGINT', () => {});

function send(msg) {
  let s = JSON.stringify(msg);
  if (s.length > MAX_RESULT) {
    process.stderr.write(`sheepfold: a result of ${s.length} bytes was dropped\n`);
    return;
  }
  fs.writeSync(4, s + '\n');
}

function errorOf(e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    return { name: e.name || 'Error', value: String(e.message), traceback: String(e.stack || e) };
  }
  return { name: 'Error', value: String(e), traceback: 'Uncaught ' + util.inspect(e) };
}

async function run(req) {
  const saved = {};
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  try {
    let value;
    try {
      value = new vm.Script(req.code, { filename: '<cell>' }).runInContext(context, { breakOnSigint: true });
    } catch (e) {
      // Top-level await: run the cell as an async function. Its let/const
      // declarations stay local to that cell; var and globals persist.
      if (e instanceof SyntaxError && /await/.test(e.message)) {
        value = new vm.Script('(async () => {\n' + req.code + '\n})()', { filename: '<cell>' })
          .runInContext(context, { breakOnSigint: true });
      } else {
        throw e;
      }
    }
    if (value && typeof value.then === 'function') value = await value;
    if (value !== undefined) {
      send({ type: 'result', result: { text: util.inspect(value), is_main_result: true } });
    }
  } catch (e) {
    send({ type: 'error', error: errorOf(e) });
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
    const marker = '\x1e' + req.marker + '\n';
    fs.writeSync(1, marker);
    fs.writeSync(2, marker);
    send({ type: 'done' });
  }
}

const rl = readline.createInterface({ input: fs.createReadStream(null, { fd: 3 }) });
let queue = Promise.resolve();
rl.on('line', (line) => { const req = JSON.parse(line); queue = queue.then(() => run(req)); });
rl.on('close', () => queue.then(() => process.exit(0)));
