// The console's build: TypeScript and JSX (Preact's, through esbuild: no plugin needed)
// bundled into ../agentrun_kubectl/console/static, which the Python package ships. No
// CDN and nothing fetched at run time: every asset is a file of that folder.
import { defineConfig } from "vite";

export default defineConfig({
  base: "/",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: {
    outDir: process.env.CONSOLE_OUT_DIR ?? "../agentrun_kubectl/console/static",
    emptyOutDir: true,
    // One stylesheet and one script (and Chart.js apart): a handful of files to ship.
    chunkSizeWarningLimit: 600,
    sourcemap: false,
  },
});
