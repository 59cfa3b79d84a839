// The official `openai` npm client, unmodified, against Sheepfold's /v1:
// configured only through OPENAI_BASE_URL and OPENAI_API_KEY, the model
// named by SHEEPFOLD_MODEL. test/integration's TestOpenAINodeClient points
// them at a fresh `sheepfold serve` whose provider is the scripted brain
// (internal/llm/llmtest): "SAY: text" answers text, "RUN:\ncode" calls
// run_code with the code, a tool message is answered "Result: " and its
// content.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import OpenAI, { AuthenticationError, NotFoundError } from 'openai'

const missing = ['OPENAI_BASE_URL', 'OPENAI_API_KEY', 'SHEEPFOLD_MODEL'].filter((k) => !process.env[k])
if (missing.length > 0) {
  throw new Error(`${missing.join(', ')} not set: run this file through \`go test ./test/integration -run TestOpenAINodeClient\``)
}
const model = process.env.SHEEPFOLD_MODEL
// No retries: a failure shows at once, and an error must come back as one.
const openai = new OpenAI({ maxRetries: 0, timeout: 60_000 })
const T = { timeout: 120_000 }

const runCode = {
  type: 'function',
  function: {
    name: 'run_code',
    description: 'Run code in the sandbox',
    parameters: { type: 'object', properties: { code: { type: 'string' } }, required: ['code'] },
  },
}

test('models.list names the configured model', T, async () => {
  const ids = []
  for await (const m of openai.models.list()) ids.push(m.id)
  assert.ok(ids.includes(model), `models ${JSON.stringify(ids)}`)
})

test('a chat completion as JSON: content, finish_reason, usage', T, async () => {
  const c = await openai.chat.completions.create({ model, messages: [{ role: 'user', content: 'SAY: hello from npm' }] })
  assert.equal(c.object, 'chat.completion')
  assert.equal(c.choices[0].message.role, 'assistant')
  assert.equal(c.choices[0].message.content, 'hello from npm')
  assert.equal(c.choices[0].finish_reason, 'stop')
  assert.ok(c.usage.prompt_tokens > 0 && c.usage.completion_tokens > 0, `usage ${JSON.stringify(c.usage)}`)
  assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens)
})

test('a streamed chat completion: chunks add up to the text, usage when asked for', T, async () => {
  const text = 'one two three four five six seven eight nine ten'
  const stream = await openai.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'SAY: ' + text }],
    stream: true,
    stream_options: { include_usage: true },
  })
  let got = ''
  let chunks = 0
  let finish = null
  let usage = null
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk')
    chunks++
    if (chunk.usage) usage = chunk.usage
    for (const ch of chunk.choices) {
      got += ch.delta?.content ?? ''
      finish = ch.finish_reason ?? finish
    }
  }
  assert.equal(got, text)
  assert.ok(chunks > 3, `${chunks} chunks: the answer was not streamed`)
  assert.equal(finish, 'stop')
  assert.ok(usage && usage.total_tokens > 0, `usage ${JSON.stringify(usage)}`)
})

test('tool calls: the model calls run_code, the tool result goes back', T, async () => {
  const messages = [{ role: 'user', content: 'RUN:\nprint(6 * 7)' }]
  const c = await openai.chat.completions.create({ model, messages, tools: [runCode] })
  const msg = c.choices[0].message
  assert.equal(c.choices[0].finish_reason, 'tool_calls')
  assert.equal(msg.tool_calls.length, 1)
  const call = msg.tool_calls[0]
  assert.equal(call.type, 'function')
  assert.equal(call.function.name, 'run_code')
  assert.equal(JSON.parse(call.function.arguments).code, 'print(6 * 7)')
  assert.ok(call.id, 'tool call without an id')

  messages.push(msg, { role: 'tool', tool_call_id: call.id, content: '42' })
  const d = await openai.chat.completions.create({ model, messages, tools: [runCode] })
  assert.equal(d.choices[0].message.content, 'Result: 42')
})

test('tool calls streamed: the helper assembles name and arguments', T, async () => {
  const stream = openai.chat.completions.stream({
    model,
    messages: [{ role: 'user', content: 'RUN:\nprint("streamed")' }],
    tools: [runCode],
  })
  const final = await stream.finalChatCompletion()
  const call = final.choices[0].message.tool_calls[0]
  assert.equal(call.function.name, 'run_code')
  assert.equal(JSON.parse(call.function.arguments).code, 'print("streamed")')
  assert.equal(final.choices[0].finish_reason, 'tool_calls')
})

test('errors: an unknown model and a wrong key are typed errors with Sheepfold codes', T, async () => {
  await assert.rejects(
    openai.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'SAY: x' }] }),
    (err) => {
      assert.ok(err instanceof NotFoundError, `${err?.constructor?.name}: ${err?.message}`)
      assert.equal(err.status, 404)
      assert.equal(err.code, 'ERR_MODEL_NOT_FOUND')
      assert.match(err.message, /no-such-model/)
      return true
    }
  )
  await assert.rejects(
    openai.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'SAY: x' }], stream: true }),
    (err) => err instanceof NotFoundError && err.code === 'ERR_MODEL_NOT_FOUND'
  )
  const stranger = new OpenAI({ apiKey: 'sf_' + '0'.repeat(40), maxRetries: 0 })
  await assert.rejects(
    stranger.chat.completions.create({ model, messages: [{ role: 'user', content: 'SAY: x' }] }),
    (err) => {
      assert.ok(err instanceof AuthenticationError, `${err?.constructor?.name}: ${err?.message}`)
      assert.equal(err.status, 401)
      assert.equal(err.code, 'ERR_AUTHENTICATION_FAILED')
      assert.match(err.message, /Authentication failed. Invalid API key/)
      return true
    }
  )
})
