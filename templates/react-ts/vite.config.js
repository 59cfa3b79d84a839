// Vite behind Sheepfold's preview, which serves the dev server on port
// 5173 in two forms:
//   host form  http(s)://5173-{sandbox id}.{preview domain}/PATH  (PATH as sent)
//   path form  /v1/sandboxes/{sandbox id}/proxy/5173/PATH         (the proxy strips the prefix)
// base is the path form's prefix (the start command is given the sandbox's
// id in SHEEPFOLD_SANDBOX_ID), so that every URL Vite writes (scripts,
// modules, assets, the hot-reload WebSocket) works in both forms: in the
// host form the prefix is sent as it is, in the path form the proxy strips
// it and prefixBase puts it back, for requests and WebSocket upgrades.
// The hot-reload client connects to the page's own host and port (no
// hmr.clientPort), so its WebSocket goes through the preview too.
import { defineConfig } from 'vite'
import react from '@vitejs/plugin-react'

const id = process.env.SHEEPFOLD_SANDBOX_ID
const base = id ? `/v1/sandboxes/${id}/proxy/5173/` : '/'

function prefixBase() {
  const add = (req) => {
    if (base !== '/' && req.url && !req.url.startsWith(base)) {
      req.url = base + req.url.replace(/^\/+/, '')
    }
  }
  return {
    name: 'sheepfold-preview-base',
    configureServer(server) {
      server.middlewares.use((req, _res, next) => {
        add(req)
        next()
      })
      server.httpServer?.prependListener('upgrade', add)
    },
  }
}

export default defineConfig({
  base,
  plugins: [prefixBase(), react()],
  server: {
    host: '127.0.0.1',
    port: 5173,
    strictPort: true,
    allowedHosts: true, // the preview's Host names the sandbox; the server checks who may reach it
  },
})
