// The code interpreter through the unmodified `@e2b/code-interpreter` SDK
// (/execute and /contexts on port 49999 of the E2B data plane).
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { NotFoundError, Sandbox, SandboxError, TimeoutError } from '@e2b/code-interpreter'
import { killAll, meta, rejectsWith, sandboxUrl, track } from './helpers.mjs'

let sbx
before(async () => {
  sbx = track(
    await Sandbox.create({ metadata: meta({ case: 'code' }), envs: { SF_GLOBAL: 'from-create' }, timeoutMs: 600_000 })
  )
}, { timeout: 120_000 })
after(killAll, { timeout: 60_000 })

const T = { timeout: 120_000 }
const stdout = (ex) => ex.logs.stdout.join('')

test('python by default: x = 1; x is 1, and state is kept', T, async () => {
  const a = await sbx.runCode('x = 1; x')
  assert.equal(a.error, undefined, `error ${JSON.stringify(a.error)}`)
  assert.equal(a.text, '1')
  assert.equal(a.results.length, 1)
  assert.equal(a.results[0].isMainResult, true)
  assert.equal(a.results[0].text, '1')
  // The first execution of a fresh sandbox (from the warm pool or not) is
  // number 1: the pool's preload is not counted, as in E2B.
  assert.equal(a.executionCount, 1)

  const b = await sbx.runCode('x += 41\nx')
  assert.equal(b.text, '42')
  assert.equal(b.executionCount, 2)

  const c = await sbx.runCode('print("no value")')
  assert.equal(c.text, undefined)
  assert.equal(c.results.length, 0)
  assert.deepEqual(c.logs.stdout, ['no value\n'])
})

test('python: cwd is /home/user, sandbox and per-run envs', T, async () => {
  assert.equal(stdout(await sbx.runCode('import os\nprint(os.getcwd())')), '/home/user\n')
  assert.equal(stdout(await sbx.runCode('import os\nprint(os.environ.get("SF_GLOBAL"))')), 'from-create\n')
  const withEnv = await sbx.runCode('import os\nprint(os.environ.get("SF_RUN"))', { envs: { SF_RUN: 'per-run' } })
  assert.equal(stdout(withEnv), 'per-run\n')
  assert.equal(stdout(await sbx.runCode('import os\nprint(os.environ.get("SF_RUN"))')), 'None\n', 'a per-run env leaked')
})

test('callbacks: onStdout, onStderr, onResult, onError', T, async () => {
  const outs = []
  const errs = []
  const results = []
  const errors = []
  const cb = {
    onStdout: (m) => outs.push(m),
    onStderr: (m) => errs.push(m),
    onResult: (r) => results.push(r),
    onError: (e) => errors.push(e),
  }
  const ex = await sbx.runCode('import sys\nprint("one")\nprint("two")\nprint("bad", file=sys.stderr)\n6 * 7', cb)
  // Like Jupyter, output written in quick succession may come as one message.
  assert.equal(outs.map((m) => m.line).join(''), 'one\ntwo\n')
  assert.ok(outs.every((m) => m.error === false && typeof m.timestamp === 'number'), JSON.stringify(outs))
  assert.deepEqual(
    errs.map((m) => [m.line, m.error]),
    [['bad\n', true]]
  )
  assert.equal(results.length, 1)
  assert.equal(results[0].text, '42')
  assert.equal(errors.length, 0)
  assert.equal(ex.logs.stdout.join(''), 'one\ntwo\n')
  assert.deepEqual(ex.logs.stderr, ['bad\n'])

  const ex2 = await sbx.runCode('1 / 0', cb)
  assert.equal(errors.length, 1)
  assert.equal(errors[0].name, 'ZeroDivisionError')
  assert.equal(ex2.error.name, 'ZeroDivisionError')
})

test('output streams while the code runs; one message for a single print', T, async () => {
  const outs = []
  let firstAt
  const ex = await sbx.runCode('import time\nprint("first", flush=True)\ntime.sleep(1.5)\nprint("second")', {
    onStdout: (m) => {
      firstAt ??= Date.now()
      outs.push(m.line)
    },
  })
  const doneAt = Date.now()
  assert.deepEqual(outs, ['first\n', 'second\n'])
  assert.deepEqual(ex.logs.stdout, ['first\n', 'second\n'])
  assert.ok(doneAt - firstAt >= 1_000, `first output only ${doneAt - firstAt} ms before the end: it was not streamed`)

  const one = []
  await sbx.runCode('print(1)', { onStdout: (m) => one.push(m.line) })
  assert.deepEqual(one, ['1\n'])
})

test('a plot and a value give two results', T, async () => {
  const seen = []
  const ex = await sbx.runCode(
    'import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nplt.show()\n"value"',
    { onResult: (r) => seen.push(r) }
  )
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  assert.equal(seen.length, 2, `results: ${JSON.stringify(seen.map((r) => r.formats()))}`)
  assert.equal(ex.results.length, 2)
  assert.ok(ex.results.some((r) => r.png && !r.isMainResult), 'the plot')
  assert.ok(ex.results.some((r) => r.isMainResult && r.text), 'the value')
})

test('python errors carry name, value and traceback', T, async () => {
  const ex = await sbx.runCode('def f():\n    return 1 / 0\nf()')
  assert.ok(ex.error, 'no error')
  assert.equal(ex.error.name, 'ZeroDivisionError')
  assert.match(ex.error.value, /division by zero/)
  assert.equal(typeof ex.error.traceback, 'string')
  assert.match(ex.error.traceback, /ZeroDivisionError/)
  assert.match(ex.error.traceback, /f\(\)/)
  assert.equal(ex.text, undefined)

  const nameErr = await sbx.runCode('undefined_name_here')
  assert.equal(nameErr.error?.name, 'NameError')
  // The kernel survives errors.
  assert.equal((await sbx.runCode('2 + 2')).text, '4')
})

test('javascript: values, console output, state, errors', T, async () => {
  const a = await sbx.runCode('const a = 40; console.log("hi from js"); a + 2', { language: 'js' })
  assert.equal(a.error, undefined, `error ${JSON.stringify(a.error)}`)
  assert.equal(a.text, '42')
  assert.deepEqual(a.logs.stdout, ['hi from js\n'])
  assert.equal((await sbx.runCode('a * 2', { language: 'javascript' })).text, '80', 'state kept between runs')
  assert.equal((await sbx.runCode('process.cwd()', { language: 'js' })).text, '/home/user', 'a string result is shown without quotes')
  assert.equal((await sbx.runCode('process.env.SF_GLOBAL', { language: 'js' })).text, 'from-create', 'sandbox env in js')
  assert.equal((await sbx.runCode('process.env.SF_RUN', { language: 'js', envs: { SF_RUN: 'js-run' } })).text, 'js-run')
  assert.equal((await sbx.runCode('String(process.env.SF_RUN)', { language: 'js' })).text, 'undefined', 'a per-run env leaked')
  const awaited = await sbx.runCode('async function main() { return 6 * 7 }\nawait main()', { language: 'js' })
  assert.equal(awaited.error, undefined, `top-level await: ${JSON.stringify(awaited.error)}`)
  assert.equal(awaited.text, '42', 'top-level await')
  const err = await sbx.runCode('throw new TypeError("boom")', { language: 'js' })
  assert.equal(err.error?.name, 'TypeError')
  assert.equal(err.error?.value, 'boom')
})

test('typescript runs on the javascript kernel', T, async () => {
  const ex = await sbx.runCode('function sub(x: number, y: number): number {\n  return x - y\n}\nsub(1, 2)', { language: 'ts' })
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  assert.equal(ex.text, '-1')
})

test('python: IPython shell escapes (!cmd)', T, async () => {
  const ex = await sbx.runCode('!pwd')
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  assert.equal(stdout(ex), '/home/user\n')
})

test('bash: output and state', T, async () => {
  const a = await sbx.runCode('echo hi-from-bash; echo $((6 * 7)); pwd', { language: 'bash' })
  assert.equal(a.error, undefined, `error ${JSON.stringify(a.error)}`)
  assert.equal(stdout(a), 'hi-from-bash\n42\n/home/user\n')
  await sbx.runCode('export SF_KEPT=kept; cd /tmp', { language: 'bash' })
  assert.equal(stdout(await sbx.runCode('echo "$SF_KEPT $PWD"', { language: 'bash' })), 'kept /tmp\n')
  assert.equal(stdout(await sbx.runCode('echo "$SF_GLOBAL"', { language: 'bash' })), 'from-create\n', 'sandbox env in bash')
  assert.equal(stdout(await sbx.runCode('echo "$SF_RUN"', { language: 'bash', envs: { SF_RUN: 'bash-run' } })), 'bash-run\n')
  assert.equal(stdout(await sbx.runCode('echo "[$SF_RUN]"', { language: 'bash' })), '[]\n', 'a per-run env leaked')
})

// E2B's own R and Java tests (js/tests/env_vars/r.test.ts and
// java.test.ts of e2b-dev/code-interpreter), rewritten here, and what they
// leave out: state, a plot, a data frame, an error. E2B's Java kernel shows
// the environment as system properties; a println's line end may come in a
// message of its own there, so the output is compared joined.
test('r: E2B env vars, state, plot, data frame, error', T, async () => {
  const hello = await sbx.runCode('print("Hello, World!")', { language: 'r' })
  // R prints the line in three writes; the kernel sends it whole, as E2B's does.
  assert.deepEqual(hello.logs.stdout, ['[1] "Hello, World!"\n'])
  const env = await sbx.runCode("Sys.getenv('SF_GLOBAL')", { language: 'r' })
  assert.equal(env.results[0]?.text.trim(), '[1] "from-create"')
  const run = await sbx.runCode("Sys.getenv('FOO')", { language: 'r', envs: { FOO: 'bar' } })
  assert.equal(run.results[0]?.text.trim(), '[1] "bar"')
  const unset = await sbx.runCode("Sys.getenv('FOO', unset = 'default')", { language: 'r' })
  assert.equal(unset.results[0]?.text.trim(), '[1] "default"')
  await sbx.runCode('n <- 20', { language: 'r' })
  const ex = await sbx.runCode('plot(1:3); data.frame(n = n + 1)', { language: 'r' })
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  assert.ok(ex.results.some((r) => r.png), 'a PNG')
  assert.ok(ex.results.some((r) => r.html?.includes('<td>21</td>')), 'the data frame as HTML')
  const err = await sbx.runCode("stop('nope')", { language: 'r' })
  assert.equal(err.error?.name, 'simpleError')
  assert.equal(err.error?.value, 'nope')
})

test('java: E2B env vars, state, error', T, async () => {
  const hello = await sbx.runCode('System.out.println("Hello, World!")', { language: 'java' })
  assert.equal(stdout(hello), 'Hello, World!\n')
  const env = await sbx.runCode('System.getProperty("SF_GLOBAL")', { language: 'java' })
  assert.equal(env.results[0]?.text.trim(), 'from-create')
  const run = await sbx.runCode('System.getProperty("SF_GLOBAL")', { language: 'java', envs: { SF_GLOBAL: 'overwrite' } })
  assert.equal(run.results[0]?.text.trim(), 'overwrite')
  const back = await sbx.runCode('System.getProperty("SF_GLOBAL")', { language: 'java' })
  assert.equal(back.results[0]?.text.trim(), 'from-create')
  const dflt = await sbx.runCode('System.getProperty("FOO", "default")', { language: 'java' })
  assert.equal(dflt.results[0]?.text.trim(), 'default')
  await sbx.runCode('int n = 20;', { language: 'java' })
  assert.equal((await sbx.runCode('n + 1', { language: 'java' })).text, '21')
  const err = await sbx.runCode('throw new IllegalStateException("nope")', { language: 'java' })
  assert.equal(err.error?.name, 'IllegalStateException')
  assert.equal(err.error?.value, 'nope')
})

test('code contexts: create, list, isolate, restart, remove', T, async () => {
  const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
  assert.ok(ctx.id, 'context id')
  assert.equal(ctx.language, 'python')
  assert.equal(ctx.cwd, '/tmp')
  try {
    assert.equal(stdout(await sbx.runCode('import os\nprint(os.getcwd())', { context: ctx })), '/tmp\n')
    await sbx.runCode('only_here = 5', { context: ctx })
    assert.equal((await sbx.runCode('only_here', { context: ctx })).text, '5')
    const other = await sbx.runCode('only_here')
    assert.equal(other.error?.name, 'NameError', 'the default context saw a new context\'s variable')

    const listed = await sbx.listCodeContexts()
    assert.ok(Array.isArray(listed))
    const mine = listed.find((c) => c.id === ctx.id)
    assert.ok(mine, `context ${ctx.id} not listed: ${JSON.stringify(listed)}`)
    assert.equal(mine.language, 'python')
    assert.equal(mine.cwd, '/tmp')

    await sbx.restartCodeContext(ctx)
    const lost = await sbx.runCode('only_here', { context: ctx })
    assert.equal(lost.error?.name, 'NameError', 'state survived restartCodeContext')
    assert.equal((await sbx.runCode('3 * 3', { context: ctx })).text, '9', 'the restarted context runs')
  } finally {
    await sbx.removeCodeContext(ctx.id)
  }
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id), 'a removed context is listed')
  await rejectsWith(sbx.runCode('1', { context: ctx }), NotFoundError, 'runCode in a removed context')

  const js = await sbx.createCodeContext({ language: 'js' })
  try {
    assert.equal(js.language, 'javascript')
    assert.equal(js.cwd, '/home/user')
    assert.equal((await sbx.runCode('let q = 7; q * 6', { context: js })).text, '42')
  } finally {
    await sbx.removeCodeContext(js)
  }
})

test('a matplotlib chart arrives as a PNG result', T, async () => {
  const ex = await sbx.runCode(
    'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()'
  )
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  const pngs = ex.results.filter((r) => r.png)
  assert.equal(pngs.length, 1, `results: ${JSON.stringify(ex.results.map((r) => r.formats()))}`)
  const png = Buffer.from(pngs[0].png, 'base64')
  assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'PNG magic bytes')
  assert.ok(png.length > 1_000, `a ${png.length}-byte PNG`)
  assert.equal(pngs[0].isMainResult, false, 'a displayed figure is not the main result')
})

test('matplotlib figures carry E2B chart data', T, async () => {
  const line = await sbx.runCode(`
import matplotlib.pyplot as plt
plt.figure()
plt.plot([0, 1, 2, 3], [0, 1, 4, 9], label="squares")
plt.plot([0, 1, 2, 3], [0, 1, 8, 27], label="cubes")
plt.xlabel("Time (s)")
plt.ylabel("Size (m)")
plt.title("growth")
plt.legend()
plt.show()
`)
  assert.equal(line.error, undefined, `error ${JSON.stringify(line.error)}`)
  const chart = line.results.find((r) => r.png)?.chart
  assert.ok(chart, `no chart: ${JSON.stringify(line.results.map((r) => r.formats()))}`)
  assert.equal(chart.type, 'line')
  assert.equal(chart.title, 'growth')
  assert.equal(chart.x_label, 'Time (s)')
  assert.equal(chart.y_label, 'Size (m)')
  assert.equal(chart.x_unit, 's')
  assert.equal(chart.y_unit, 'm')
  assert.deepEqual(
    chart.elements.map((e) => e.label),
    ['squares', 'cubes']
  )
  assert.deepEqual(chart.elements[0].points, [
    [0, 0],
    [1, 1],
    [2, 4],
    [3, 9],
  ])

  const bar = await sbx.runCode(`
import matplotlib.pyplot as plt
plt.figure()
plt.bar(["apples", "pears"], [3, 5])
plt.title("fruit")
plt.show()
`)
  const bchart = bar.results.find((r) => r.png)?.chart
  assert.ok(bchart, 'no bar chart')
  assert.equal(bchart.type, 'bar')
  assert.equal(bchart.title, 'fruit')
  assert.deepEqual(
    bchart.elements.map((e) => [e.label, e.value]),
    [
      ['apples', 3],
      ['pears', 5],
    ]
  )
})

test('a PIL image as the last expression is a PNG result', T, async () => {
  const ex = await sbx.runCode('from PIL import Image\nImage.new("RGB", (16, 16), "red")')
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  const png = ex.results.find((r) => r.png)
  assert.ok(png, `no png: ${JSON.stringify(ex.results.map((r) => r.formats()))}`)
  assert.deepEqual([...Buffer.from(png.png, 'base64').subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47])
})

test('a pandas DataFrame arrives as an HTML result', T, async () => {
  const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"city": ["Oslo", "Lima"], "n": [11, 22]})')
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  const main = ex.results.find((r) => r.isMainResult)
  assert.ok(main, 'no main result')
  assert.match(main.html ?? '', /<table/)
  assert.match(main.html, /Oslo/)
  assert.match(main.html, /22/)
  assert.match(main.text ?? '', /Lima/)
})

test('timeoutMs on runCode: TimeoutError, and the kernel is free again', T, async () => {
  const t0 = Date.now()
  await rejectsWith(sbx.runCode('import time\ntime.sleep(60)', { timeoutMs: 2_000 }), TimeoutError, 'runCode past timeoutMs')
  assert.ok(Date.now() - t0 < 10_000)
  const t1 = Date.now()
  const ex = await sbx.runCode('1 + 1', { timeoutMs: 15_000 })
  assert.equal(ex.text, '2')
  assert.ok(Date.now() - t1 < 10_000, `the next run waited ${Date.now() - t1} ms: the abandoned one was not interrupted`)
})

test('an indented cell runs as IPython runs it (common indentation removed)', T, async () => {
  // What a user gets from a template string written inside a function.
  const ex = await sbx.runCode(`
    import datetime
    def double(x):
        return x * 2

    print(datetime.date(2024, 1, 2).isoformat())
    double(21)
  `)
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  assert.deepEqual(ex.logs.stdout, ['2024-01-02\n'])
  assert.equal(ex.text, '42')
})

test('a pandas DataFrame result carries data (its columns as lists) besides text and html', T, async () => {
  const ex = await sbx.runCode(
    'import pandas as pd\ndf = pd.DataFrame({"city": ["Oslo", "Lima"], "n": [11, 22], "x": [0.5, float("nan")],' +
      ' "day": pd.to_datetime(["2024-01-02", "2024-03-04 05:06:07"])})\ndisplay(df)\ndf'
  )
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  assert.equal(ex.results.length, 2)
  for (const r of ex.results) {
    // Timestamps in ISO 8601, as E2B's data formatter gives them.
    assert.deepEqual(r.data, { city: ['Oslo', 'Lima'], n: [11, 22], x: [0.5, null], day: ['2024-01-02T00:00:00', '2024-03-04T05:06:07'] })
    assert.match(r.html ?? '', /<table/)
    assert.match(r.text ?? '', /Oslo/)
    assert.deepEqual(r.extra, {})
    assert.ok(r.formats().includes('data'), `formats ${r.formats()}`)
  }
  assert.equal(ex.results[1].isMainResult, true)
})

test('figures: png, text and chart as E2B gives them (null title, pie degrees, box plots, date and category scales)', T, async () => {
  const chartOf = async (code) => {
    const ex = await sbx.runCode(code)
    assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
    assert.equal(ex.results.length, 1, `results ${JSON.stringify(ex.results.map((r) => r.formats()))}`)
    const r = ex.results[0]
    assert.ok(r.png, 'no png')
    assert.match(r.text ?? '', /^<Figure size/)
    assert.deepEqual(r.extra, {}, 'extra is empty for a figure')
    assert.ok(r.chart, 'no chart')
    return r.chart
  }

  const pie = await chartOf(`
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.pie([90, 10], labels=["No", "No, in blue"], startangle=90)
    plt.show()
  `)
  assert.equal(pie.type, 'pie')
  assert.equal(pie.title, null, 'an unset title is null')
  assert.deepEqual(
    pie.elements.map((e) => [e.label, e.angle, e.radius]),
    [
      ['No', 324, 1],
      ['No, in blue', 36, 1],
    ]
  )

  const box = await chartOf(`
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.boxplot([[1, 2, 3, 4, 5], [2, 4, 6, 8, 10]], labels=["A", "B"], patch_artist=True)
    ax.set_title("Scores")
    ax.set_xlabel("Class")
    ax.set_ylabel("Score [pts]")
    plt.show()
  `)
  assert.equal(box.type, 'box_and_whisker')
  assert.equal(box.title, 'Scores')
  assert.equal(box.x_label, 'Class')
  assert.equal(box.x_unit, null)
  assert.equal(box.y_unit, 'pts')
  assert.deepEqual(box.elements, [
    { label: 'A', min: 1, first_quartile: 2, median: 3, third_quartile: 4, max: 5, outliers: [] },
    { label: 'B', min: 2, first_quartile: 4, median: 6, third_quartile: 8, max: 10, outliers: [] },
  ])

  const dates = await chartOf(`
    import datetime
    import matplotlib.pyplot as plt
    days = [datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in range(5)]
    plt.figure()
    plt.plot(days, [1, 3, 2, 5, 4], label="visits")
    plt.show()
  `)
  assert.equal(dates.type, 'line')
  assert.equal(dates.x_scale, 'datetime')
  assert.equal(dates.y_scale, 'linear')
  assert.equal(dates.title, null)
  assert.equal(dates.x_label, null)
  assert.equal(dates.elements[0].label, 'visits')
  assert.deepEqual(dates.elements[0].points[0], ['2024-01-01', 1])
  assert.ok(dates.x_ticks.every((t) => typeof t === 'string' && !Number.isNaN(Date.parse(t))), `x_ticks ${dates.x_ticks}`)

  const cats = await chartOf(`
    import matplotlib.pyplot as plt
    plt.figure()
    plt.plot([1, 2, 3], ["low", "mid", "high"])
    plt.show()
  `)
  assert.equal(cats.x_scale, 'linear')
  assert.equal(cats.y_scale, 'categorical')
  assert.deepEqual(cats.y_tick_labels, ['low', 'mid', 'high'])
  assert.equal(cats.elements[0].label, 'Line 0', 'an unnamed line is named as E2B names it')
})

test('PIL images: the last expression, image.show() and image.save("x.png") each give a PNG result', T, async () => {
  const isPNG = (r) => r.png && Buffer.from(r.png, 'base64').subarray(0, 4).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47]))
  const last = await sbx.runCode('from PIL import Image\nImage.new("RGB", (8, 8), "blue")')
  assert.equal(last.results.length, 1)
  assert.ok(isPNG(last.results[0]) && last.results[0].isMainResult, 'the last expression')

  const shown = await sbx.runCode('from PIL import Image\nimg = Image.new("RGB", (8, 8), "green")\nimg.show()\nprint("after show")')
  assert.equal(shown.error, undefined, `error ${JSON.stringify(shown.error)}`)
  assert.equal(shown.results.length, 1, `results ${JSON.stringify(shown.results.map((r) => r.formats()))}`)
  assert.ok(isPNG(shown.results[0]) && !shown.results[0].isMainResult, 'image.show()')
  assert.deepEqual(shown.logs.stdout, ['after show\n'])

  const saved = await sbx.runCode('from PIL import Image\nimport io\nimg = Image.new("RGB", (8, 8), "red")\nimg.save("pil-saved.png")\nimg.save(io.BytesIO(), format="PNG")')
  assert.equal(saved.error, undefined, `error ${JSON.stringify(saved.error)}`)
  assert.equal(saved.results.length, 1, 'a save to a file name displays the image; a save to a buffer does not')
  assert.ok(isPNG(saved.results[0]), 'image.save()')
  const file = await sbx.files.read('/home/user/pil-saved.png', { format: 'bytes' })
  assert.deepEqual([...file.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47], 'the file is written too')
})

test('results reach onResult as they are produced (display, plt.show), not when the cell ends', T, async () => {
  const t0 = Date.now()
  const at = []
  const ex = await sbx.runCode(
    'import time\nimport matplotlib.pyplot as plt\ndisplay("first")\nplt.plot([1, 2])\nplt.show()\ntime.sleep(2)\n"last"',
    { onResult: (r) => at.push([r.isMainResult ? 'main' : r.png ? 'png' : r.text, Date.now() - t0]) }
  )
  const end = Date.now() - t0
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  assert.deepEqual(
    at.map(([what]) => what),
    ['first', 'png', 'main']
  )
  for (const [what, ms] of at.slice(0, 2)) {
    assert.ok(end - ms >= 1_500, `${what} arrived ${end - ms} ms before the end: it was not streamed`)
  }
})

test('a fresh sandbox lists its default python and javascript contexts, usable by id', T, async () => {
  const fresh = track(await Sandbox.create({ metadata: meta({ case: 'default-contexts' }), timeoutMs: 120_000 }))
  try {
    const listed = await fresh.listCodeContexts()
    const byLang = Object.fromEntries(listed.map((c) => [c.language, c]))
    for (const l of ['python', 'javascript']) {
      assert.ok(byLang[l], `no default ${l} context: ${JSON.stringify(listed)}`)
      assert.equal(typeof byLang[l].id, 'string')
      assert.ok(byLang[l].id.length > 0)
      assert.equal(byLang[l].cwd, '/home/user')
    }
    assert.equal(new Set(listed.map((c) => c.id)).size, listed.length, 'ids are unique')
    // The listed javascript context is the one runCode's language picks.
    assert.equal((await fresh.runCode('var shared = 6 * 7', { context: byLang.javascript })).error, undefined)
    assert.equal((await fresh.runCode('shared', { language: 'javascript' })).text, '42')
    assert.equal((await fresh.runCode('import os\nos.getcwd()', { context: byLang.python })).text, '/home/user')
    const again = await fresh.listCodeContexts()
    assert.deepEqual(
      again.filter((c) => c.id === byLang.python.id || c.id === byLang.javascript.id),
      [byLang.python, byLang.javascript],
      'a started default context is listed as before'
    )
  } finally {
    await fresh.kill()
  }
})

test('createCodeContext: a new id each time; cwd and language combinations; E2B\'s cwd rule', T, async () => {
  const a = await sbx.createCodeContext()
  const b = await sbx.createCodeContext()
  const made = [a, b]
  try {
    assert.notEqual(a.id, b.id)
    const defaults = (await sbx.listCodeContexts()).filter((c) => c.id !== a.id && c.id !== b.id).map((c) => c.id)
    assert.ok(!defaults.includes(a.id) && !defaults.includes(b.id), 'a new context is not a default one')
    assert.deepEqual([a.language, a.cwd], ['python', '/home/user'])
    await sbx.runCode('mine = "a"', { context: a })
    assert.equal((await sbx.runCode('mine', { context: b })).error?.name, 'NameError', 'two new contexts share state')

    for (const [opts, want] of [
      [{ cwd: '/tmp', language: 'python' }, '/tmp'],
      [{ cwd: '/tmp', language: 'javascript' }, '/tmp'],
      [{ cwd: '/tmp', language: 'bash' }, '/tmp'],
      [{ cwd: '/home/user' }, '/home/user'],
      [{ language: 'typescript' }, '/home/user'],
    ]) {
      const c = await sbx.createCodeContext(opts)
      made.push(c)
      assert.equal(c.cwd, want, JSON.stringify(opts))
      const code = { python: 'import os\nos.getcwd()', javascript: 'process.cwd()', typescript: 'process.cwd() as string', bash: 'pwd' }[c.language]
      const ex = await sbx.runCode(code, { context: c })
      assert.equal(ex.error, undefined, `${JSON.stringify(opts)}: ${JSON.stringify(ex.error)}`)
      assert.equal((ex.text ?? ex.logs.stdout.join('')).trim().replace(/^'|'$/g, ''), want, JSON.stringify(opts))
    }

    // Contexts run as the sandbox's user, who cannot enter /root. E2B's
    // server changes each new context into its cwd as root: the context
    // reports that directory and really runs in it. So does Sheepfold's,
    // in every language, still as "user" (who may read nothing there).
    const inRoot = {
      python: 'import os, getpass\nprint(getpass.getuser(), os.getcwd())',
      javascript: 'console.log(require("os").userInfo().username, process.cwd())',
      typescript: 'console.log(require("os").userInfo().username as string, process.cwd())',
      bash: 'echo "$(whoami) $(pwd)"',
    }
    for (const language of Object.keys(inRoot)) {
      const root = await sbx.createCodeContext({ cwd: '/root', language })
      made.push(root)
      assert.deepEqual([root.language, root.cwd], [language, '/root'])
      assert.ok(!defaults.includes(root.id))
      const who = await sbx.runCode(inRoot[language], { context: root })
      assert.equal(who.error, undefined, `${language}: ${JSON.stringify(who.error)}`)
      assert.deepEqual(who.logs.stdout, ['user /root\n'], language)
      const listed = (await sbx.listCodeContexts()).find((c) => c.id === root.id)
      assert.deepEqual(listed, { id: root.id, language, cwd: '/root' }, `${language}: listed`)
    }
    // A cwd that is not there, or not a directory, is the request's
    // mistake: a 400 (E2B answers 500, or for Python makes the context in
    // another directory than the one it reports).
    for (const [cwd, language] of [
      ['/no/such/dir', 'python'],
      ['/no/such/dir', 'javascript'],
      ['/etc/passwd', 'bash'],
    ]) {
      const err = await rejectsWith(sbx.createCodeContext({ cwd, language }), SandboxError, `a ${language} context in ${cwd}`)
      assert.match(err.message, /^400 Bad Request/, `${language} in ${cwd}`)
    }
    // The SDK shows only the status; the body names the reason.
    for (const [cwd, want] of [
      ['/no/such/dir', 'cwd /no/such/dir does not exist\n'],
      ['/etc/passwd', 'cwd /etc/passwd: not a directory\n'],
    ]) {
      const res = await fetch(`${sandboxUrl}/contexts`, {
        method: 'POST',
        headers: {
          'Content-Type': 'application/json',
          'E2b-Sandbox-Id': sbx.sandboxId,
          'E2b-Sandbox-Port': '49999',
          'E2B-Traffic-Access-Token': sbx.trafficAccessToken,
        },
        body: JSON.stringify({ cwd, language: 'python' }),
      })
      assert.deepEqual([res.status, await res.text()], [400, want], cwd)
    }
  } finally {
    for (const c of made) await sbx.removeCodeContext(c)
  }
})

test('javascript: static ESM imports next to require and top-level await', T, async () => {
  await sbx.files.write('/home/user/esm-helper.mjs', 'export const answer = 42\nexport default function greet(n) { return `hi ${n}` }\n')
  const ex = await sbx.runCode(
    `import { readFileSync } from 'fs'
import * as path from 'node:path'
import greet, { answer as theAnswer } from './esm-helper.mjs'
const os = require('os')
const text = readFileSync('/home/user/esm-helper.mjs', 'utf8')
const slept = await new Promise((r) => setTimeout(() => r('awaited'), 10))
console.log(path.join('a', 'b'), typeof os.hostname(), slept)
greet(theAnswer + (text.includes('answer') ? 0 : 1))`,
    { language: 'javascript' }
  )
  assert.equal(ex.error, undefined, `error ${JSON.stringify(ex.error)}`)
  assert.deepEqual(ex.logs.stdout, ['a/b string awaited\n'])
  assert.equal(ex.text, 'hi 42')
  // The imported names outlive the cell, as other declarations do.
  const later = await sbx.runCode('typeof readFileSync + " " + theAnswer', { language: 'javascript' })
  assert.equal(later.text, 'function 42')
})
