// Built output is committed (console/dist/) and embedded in the hub; a test
// rebuilds it and compares byte for byte, so the build must be
// deterministic: no source maps, no inlined data URLs, names by content hash.
import { defineConfig } from "vite";

export default defineConfig({
  base: "/",
  oxc: { jsx: { runtime: "automatic", importSource: "preact" } },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    sourcemap: false,
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    target: "es2022",
    reportCompressedSize: false,
    chunkSizeWarningLimit: 400,
  },
});
