// Parse Mermaid diagrams with the real Mermaid parser (the package GitHub's renderer is built on).
// Input: a JSON array of diagram sources on stdin. Output: a JSON array of
// {ok, type, error} on stdout, one per diagram. Exit status 1 when any diagram fails.
// mermaid.parse() sanitises text through DOMPurify, which needs a DOM: jsdom provides one.
import { JSDOM } from 'jsdom';

const dom = new JSDOM('<!doctype html><html><body></body></html>');
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import('mermaid');
mermaid.initialize({ startOnLoad: false, securityLevel: 'strict' });

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const diagrams = JSON.parse(Buffer.concat(chunks).toString('utf8'));
if (!Array.isArray(diagrams)) throw new Error('expected a JSON array of diagram sources on stdin');

const results = [];
for (const source of diagrams) {
  try {
    const parsed = await mermaid.parse(source);
    results.push({ ok: true, type: parsed.diagramType, error: null });
  } catch (err) {
    results.push({ ok: false, type: null, error: String(err && err.message ? err.message : err) });
  }
}
process.stdout.write(JSON.stringify(results));
process.exitCode = results.every((r) => r.ok) ? 0 : 1;
