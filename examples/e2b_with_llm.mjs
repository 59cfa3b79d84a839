#!/usr/bin/env node
// A model writes the code, the E2B code interpreter runs it: the official
// `openai` npm client and the unmodified `@e2b/code-interpreter` SDK, both
// pointed at one Sheepfold server. Sheepfold relays the chat completions to
// the provider its config file names (adding the provider's key) and runs
// the sandbox the E2B SDK asks for.
//
// Both clients are configured only through their own environment variables,
// so the same file runs against a real provider, against Sheepfold, or
// against E2B itself:
//
//   cd examples && npm ci
//   OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=sf_... \
//   E2B_API_URL=http://127.0.0.1:8080 E2B_SANDBOX_URL=http://127.0.0.1:8080 E2B_API_KEY=e2b_... \
//   SHEEPFOLD_MODEL=deepseek-chat node e2b_with_llm.mjs
//
// (sheepfold keys create --e2b mints an e2b_ key; either key works on /v1.)
// The model gets a run_code tool; a model that answers with fenced code
// instead has the fences stripped and the code run. Each execution's output
// goes back to the model until it answers in plain text, within MAX_STEPS.
import OpenAI from 'openai'
import { Sandbox } from '@e2b/code-interpreter'

const MODEL = process.env.SHEEPFOLD_MODEL || 'deepseek-chat'
const QUESTION = process.argv[2] || 'How many distinct orders are in orders.csv?'
const MAX_STEPS = 6

const tools = [
  {
    type: 'function',
    function: {
      name: 'run_code',
      description: 'Run Python code in a sandbox whose working directory holds orders.csv; returns stdout, stderr, results and errors.',
      parameters: {
        type: 'object',
        properties: {
          code: { type: 'string', description: 'the code to run' },
          language: { type: 'string', enum: ['python'] },
        },
        required: ['code'],
      },
    },
  },
]

// ordersCSV is a small orders export in which a few orders appear twice.
function ordersCSV() {
  const rows = ['order_id,country,sku,qty,price']
  const countries = ['DE', 'FR', 'US', 'NL']
  for (let i = 1; i <= 40; i++) {
    rows.push(`${1000 + i},${countries[i % countries.length]},SKU-${i % 5},${1 + (i % 3)},${(9.99 * (1 + (i % 7))).toFixed(2)}`)
  }
  rows.push(rows[3], rows[17], rows[29]) // a payment retry charged these twice
  return rows.join('\n') + '\n'
}

// fenced returns the code of the first fenced block in text, or ''.
function fenced(text) {
  const m = /```[a-zA-Z0-9_+-]*\n([\s\S]*?)```/.exec(text || '')
  return m ? m[1] : ''
}

// describe turns an execution into the text the model reads.
function describe(execution) {
  const parts = []
  const { stdout, stderr } = execution.logs
  if (stdout.length) parts.push(stdout.join(''))
  if (stderr.length) parts.push('stderr:\n' + stderr.join(''))
  for (const r of execution.results) {
    if (r.text !== undefined) parts.push(r.text)
    else if (r.png) parts.push('[a PNG image]')
  }
  if (execution.error) parts.push(`${execution.error.name}: ${execution.error.value}`)
  return parts.join('\n').trim() || '(no output)'
}

async function main() {
  const openai = new OpenAI() // OPENAI_BASE_URL, OPENAI_API_KEY
  const sbx = await Sandbox.create({ timeoutMs: 5 * 60_000 }) // E2B_API_KEY, E2B_API_URL / E2B_DOMAIN
  const started = Date.now()
  let tokens = 0
  let executions = 0
  try {
    await sbx.files.write('orders.csv', ordersCSV())
    const messages = [
      { role: 'system', content: 'You answer questions about data by running Python with the run_code tool. Answer briefly.' },
      { role: 'user', content: QUESTION },
    ]
    console.log(`question: ${QUESTION}`)
    for (let step = 1; ; step++) {
      if (step > MAX_STEPS) throw new Error(`no answer after ${MAX_STEPS} steps`)
      const completion = await openai.chat.completions.create({ model: MODEL, messages, tools })
      tokens += completion.usage?.total_tokens ?? 0
      const msg = completion.choices[0].message
      messages.push(msg)
      if (msg.tool_calls?.length) {
        for (const call of msg.tool_calls) {
          const args = JSON.parse(call.function.arguments || '{}')
          const execution = await sbx.runCode(args.code, { language: args.language || 'python' })
          executions++
          const out = describe(execution)
          console.log(`step ${step} ran ${call.function.name}: ${out}`)
          messages.push({ role: 'tool', tool_call_id: call.id, content: out })
        }
        continue
      }
      const code = fenced(msg.content)
      if (code) {
        const execution = await sbx.runCode(code)
        executions++
        const out = describe(execution)
        console.log(`step ${step} ran fenced code: ${out}`)
        messages.push({ role: 'user', content: `The code ran. Its output:\n${out}\nAnswer the question in plain text now.` })
        continue
      }
      console.log(`answer: ${msg.content}`)
      break
    }
  } finally {
    await sbx.kill()
  }
  console.log(`${executions} executions, ${tokens} tokens, ${Date.now() - started} ms`)
}

main().catch((err) => {
  console.error(`e2b_with_llm: ${err?.constructor?.name ?? 'Error'}: ${err?.message ?? err}`)
  process.exit(1)
})
