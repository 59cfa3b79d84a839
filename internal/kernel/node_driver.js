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
// __sheepfold_import is what a cell's static imports become (esmImports): the
// driver's own import(), which a vm script cannot make itself, with
// relative paths taken from the current directory.
sandbox.__sheepfold_import = (spec) => {
  const rel = spec.startsWith('./') || spec.startsWith('../') || spec.startsWith('/');
  return import(rel ? require('url').pathToFileURL(require('path').resolve(process.cwd(), spec)).href : spec);
};
const context = vm.createContext(sandbox);
process.on('SIGINT', () => {});

// send writes one message; one too large for the protocol is cut (an
// error's text) or replaced by a "dropped" message saying how large it was.
function send(msg) {
  let s = JSON.stringify(msg);
  if (Buffer.byteLength(s) > MAX_RESULT && msg.type === 'error') {
    const clip = (t, n) => (t.length <= n ? t : t.slice(0, n) + `... [${t.length - n} characters cut]`);
    msg.error.value = clip(String(msg.error.value), 65536);
    msg.error.traceback = clip(String(msg.error.traceback), 524288);
    s = JSON.stringify(msg);
  }
  if (Buffer.byteLength(s) > MAX_RESULT) {
    s = JSON.stringify({ type: 'dropped', what: msg.type, bytes: Buffer.byteLength(s), limit: MAX_RESULT });
  }
  fs.writeSync(4, s + '\n');
}

// denySubprocess: the interpreter runs under the no-subprocess seccomp
// filter (the agent started it so); a spawn that failed with EPERM is
// reported as the policy's refusal.
let denySubprocess = false;

function errorOf(e) {
  if (denySubprocess && e && e.code === 'EPERM' && typeof e.syscall === 'string' && e.syscall.startsWith('spawn')) {
    return { name: 'SubprocessDeniedError',
      value: `Running programs and creating processes is blocked by security policy (${e.syscall})`,
      traceback: String(e.stack || e) };
  }
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    return { name: e.name || 'Error', value: String(e.message), traceback: String(e.stack || e) };
  }
  return { name: 'Error', value: String(e), traceback: 'Uncaught ' + util.inspect(e) };
}

// asyncCell compiles a cell that uses top-level await as an async function.
// Declarations at the start of an unindented line (const/let/var x = ...,
// function f, class C) become properties of the context's global object, so
// they outlive the cell as in a notebook; a last line that is an expression
// becomes the cell's value.
function asyncCell(code) {
  const decl = /^(?:(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=|(async\s+)?function\s*(\*?)\s*([A-Za-z_$][\w$]*)|class\s+([A-Za-z_$][\w$]*))/gm;
  const body = code.replace(decl, (m, v, asyncKw, star, fn, cls) => {
    if (v) return `globalThis.${v} =`;
    if (fn) return `globalThis.${fn} = ${asyncKw || ''}function${star} ${fn}`;
    return `globalThis.${cls} = class ${cls}`;
  });
  const lines = body.replace(/\s+$/, '').split('\n');
  const last = lines.pop().replace(/;\s*$/, '');
  const head = lines.join('\n') + '\n';
  // The value is the last line, or what follows one of its semicolons.
  const candidates = [head + 'return (' + last + '\n);'];
  for (let i = last.lastIndexOf(';'); i > 0; i = last.lastIndexOf(';', i - 1)) {
    if (last.slice(i + 1).trim()) candidates.push(head + last.slice(0, i + 1) + '\nreturn (' + last.slice(i + 1) + '\n);');
  }
  candidates.push(body);
  for (const src of candidates) {
    try {
      return new vm.Script('(async () => {\n' + src + '\n})()', { filename: '<cell>' });
    } catch (e) {
      if (!(e instanceof SyntaxError) || src === body) throw e;
    }
  }
}

// esmImports rewrites the static imports at the start of a cell's lines
// (import d from 'm', import * as ns from 'm', import { a, b as c } from
// 'm', import d, { a } from 'm', import 'm') into awaited dynamic imports
// whose bindings become globals, so that they outlive the cell as its other
// declarations do. Each rewrite keeps the statement's line count. It
// returns null for a cell without static imports.
function esmImports(code) {
  const stmt = /^([ \t]*)import(?:\s+([A-Za-z_$][\w$]*)\s*,?)?\s*(?:\*\s*as\s+([A-Za-z_$][\w$]*)|\{([^}]*)\})?\s*(?:from\s*)?(['"])([^'"\n]+)\5[ \t]*;?/gm;
  let changed = false;
  const out = code.replace(stmt, (m, indent, def, ns, named, q, spec) => {
    if (!def && !ns && named === undefined && /\bfrom\s*['"]/.test(m)) return m;
    if ((def || ns || named !== undefined) && !/\bfrom\s*['"]/.test(m)) return m;
    const binds = [];
    if (def) binds.push(`globalThis.${def} = __m.default;`);
    if (ns) binds.push(`globalThis.${ns} = __m;`);
    for (const part of (named || '').split(',')) {
      const p = part.trim().match(/^([A-Za-z_$][\w$]*)(?:\s+as\s+([A-Za-z_$][\w$]*))?$/);
      if (p) binds.push(`globalThis.${p[2] || p[1]} = __m.${p[1]};`);
    }
    changed = true;
    const lines = '\n'.repeat((m.match(/\n/g) || []).length);
    return `${indent}{ const __m = await __sheepfold_import(${JSON.stringify(spec)}); ${binds.join(' ')} }${lines}`;
  });
  return changed ? out : null;
}

async function run(req) {
  if (req.policy && req.policy.deny_subprocess) denySubprocess = true;
  const saved = {};
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  try {
    let value;
    const imported = esmImports(req.code);
    try {
      if (imported !== null) {
        // Static imports: the cell runs as an async function.
        value = asyncCell(imported).runInContext(context, { breakOnSigint: true });
      } else {
        value = new vm.Script(req.code, { filename: '<cell>' }).runInContext(context, { breakOnSigint: true });
      }
    } catch (e) {
      // Top-level await: run the cell as an async function (see asyncCell).
      if (e instanceof SyntaxError && /await/.test(e.message)) {
        value = asyncCell(req.code).runInContext(context, { breakOnSigint: true });
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
