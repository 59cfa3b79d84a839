import { defineConfig } from 'vite'

// The build goes where the Go binary embeds it (internal/ui/dist).
export default defineConfig({
  base: '/ui/',
  build: {
    outDir: '../internal/ui/dist',
    emptyOutDir: true,
    sourcemap: false,
  },
})
