// Glovebox Java kernel: one JShell (JDK 11+) per code-interpreter context, run by the
// source launcher (`java java_kernel.java`).
//
// Protocol (the same for every kernel; python_kernel.py has the full text): JSON-line
// requests {"id", "code", "env"?, "scoped_env"?} on stdin; JSON-line events on stdout:
// ready {"language": "java"}, then per request stdout/stderr {text}, result {data,
// is_main_result}, error {name, value, traceback} and always, last, end {execution_count}.
//
// Decisions:
// * Cells are split into snippets as jshell splits them and run in this JVM (JShell's
//   local execution engine), so state persists and startup is one JVM. jshell's default
//   imports (java.util.*, java.io.*, ...) are in place.
// * The main result is the value of the cell's last snippet when it is an expression (what
//   jshell prints as `$1 ==> ...`), as text/plain; a String is given without its quotes.
// * Output: System.out/err are replaced by streams that send one event per line, without
//   its newline (as E2B's Java kernel does); a partial line is sent when the cell ends.
//   System.in is empty. Child processes that inherit fd 1 write into the protocol stream,
//   where the daemon skips lines that are not events.
// * A snippet that does not compile ends the cell with an error named CompilationError; an
//   exception with one named after its class (simple name), value its message.
// * Environment: Java cannot change its own environment, so `env` and `scoped_env` become
//   system properties (`System.getProperty("NAME")`, as on E2B); `env` for good,
//   `scoped_env` for the cell only.
// * SIGINT while a cell runs stops it (error KeyboardInterrupt, state kept).

import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import java.util.concurrent.atomic.AtomicBoolean;
import jdk.jshell.*;

public class JavaKernel {
    static final PrintStream PROTO =
            new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    static volatile String outputId = null;
    static final AtomicBoolean running = new AtomicBoolean(false);
    static volatile boolean interrupted = false;

    static void send(Map<String, Object> ev) {
        String line = Json.write(ev);
        synchronized (PROTO) {
            PROTO.print(line);
            PROTO.print('\n');
            PROTO.flush();
        }
    }

    static Map<String, Object> event(String type, String id) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("type", type);
        m.put("id", id);
        return m;
    }

    /** Sends what a cell writes, one event per line. */
    static final class Lines extends OutputStream {
        final String stream;
        final ByteArrayOutputStream buf = new ByteArrayOutputStream();

        Lines(String stream) {
            this.stream = stream;
        }

        @Override
        public synchronized void write(int b) {
            if (b == '\n') {
                emit();
            } else {
                buf.write(b);
            }
        }

        @Override
        public synchronized void write(byte[] b, int off, int len) {
            for (int i = off; i < off + len; i++) write(b[i]);
        }

        synchronized void emit() {
            String text = buf.toString(StandardCharsets.UTF_8);
            buf.reset();
            Map<String, Object> ev = event(stream, outputId);
            ev.put("text", text);
            send(ev);
        }

        /** The partial line at the end of a cell. */
        synchronized void end() {
            if (buf.size() > 0) emit();
        }
    }

    static final Lines OUT = new Lines("stdout");
    static final Lines ERR = new Lines("stderr");
    static final String[] IMPORTS = {
        "java.io.*", "java.math.*", "java.net.*", "java.nio.file.*", "java.util.*",
        "java.util.concurrent.*", "java.util.function.*", "java.util.prefs.*", "java.util.regex.*",
        "java.util.stream.*",
    };

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        System.setIn(new ByteArrayInputStream(new byte[0]));
        PrintStream out = new PrintStream(OUT, true, StandardCharsets.UTF_8);
        PrintStream err = new PrintStream(ERR, true, StandardCharsets.UTF_8);
        System.setOut(out);
        System.setErr(err);
        JShell js = JShell.builder().executionEngine("local").out(out).err(err).build();
        for (String i : IMPORTS) js.eval("import " + i + ";");
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), s -> {
            if (running.get()) {
                interrupted = true;
                js.stop();
            }
        });
        Map<String, Object> ready = new LinkedHashMap<>();
        ready.put("type", "ready");
        ready.put("language", "java");
        send(ready);
        long count = 0;
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            Object parsed;
            try {
                parsed = Json.parse(line);
            } catch (RuntimeException e) {
                protocolError(null, "request is not JSON: " + e.getMessage(), count);
                continue;
            }
            if (!(parsed instanceof Map) || !(((Map<?, ?>) parsed).get("id") instanceof String)) {
                protocolError(null, "request needs a string \"id\"", count);
                continue;
            }
            Map<?, ?> req = (Map<?, ?>) parsed;
            String id = (String) req.get("id");
            if (!(req.get("code") instanceof String)) {
                protocolError(id, "request needs a string \"code\"", count);
                continue;
            }
            count++;
            outputId = id;
            setProperties(req.get("env"));
            Map<String, String> saved = new HashMap<>();
            if (req.get("scoped_env") instanceof Map) {
                for (Map.Entry<?, ?> e : ((Map<?, ?>) req.get("scoped_env")).entrySet()) {
                    String k = String.valueOf(e.getKey());
                    saved.put(k, System.getProperty(k));
                }
                setProperties(req.get("scoped_env"));
            }
            runCell(js, id, (String) req.get("code"));
            for (Map.Entry<String, String> e : saved.entrySet()) {
                if (e.getValue() == null) System.clearProperty(e.getKey());
                else System.setProperty(e.getKey(), e.getValue());
            }
            out.flush();
            err.flush();
            OUT.end();
            ERR.end();
            Map<String, Object> end = event("end", id);
            end.put("execution_count", count);
            send(end);
        }
        System.exit(0);
    }

    static void setProperties(Object vars) {
        if (!(vars instanceof Map)) return;
        for (Map.Entry<?, ?> e : ((Map<?, ?>) vars).entrySet()) {
            String k = String.valueOf(e.getKey());
            if (!k.isEmpty()) System.setProperty(k, String.valueOf(e.getValue()));
        }
    }

    static void protocolError(String id, String message, long count) {
        Map<String, Object> ev = event("error", id);
        ev.put("name", "ProtocolError");
        ev.put("value", message);
        ev.put("traceback", message);
        send(ev);
        if (id != null) {
            Map<String, Object> end = event("end", id);
            end.put("execution_count", count);
            send(end);
        }
    }

    static void error(String id, String name, String value, String traceback) {
        System.out.flush();
        System.err.flush();
        OUT.end();
        ERR.end();
        Map<String, Object> ev = event("error", id);
        ev.put("name", name);
        ev.put("value", value == null ? "" : value);
        ev.put("traceback", traceback);
        send(ev);
    }

    static void runCell(JShell js, String id, String code) {
        SourceCodeAnalysis sca = js.sourceCodeAnalysis();
        String rest = code;
        String lastValue = null;
        interrupted = false;
        running.set(true);
        try {
            while (!rest.isBlank()) {
                SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
                if (ci.completeness() == SourceCodeAnalysis.Completeness.EMPTY) break;
                String src;
                if (ci.completeness().isComplete()) {
                    src = ci.source();
                    rest = ci.remaining();
                } else {
                    // Incomplete input: let the compiler say what is missing.
                    src = rest;
                    rest = "";
                }
                lastValue = null;
                for (SnippetEvent e : js.eval(src)) {
                    if (e.causeSnippet() != null) continue;
                    Snippet s = e.snippet();
                    if (interrupted) {
                        error(id, "KeyboardInterrupt", "interrupted", "KeyboardInterrupt: interrupted by SIGINT");
                        return;
                    }
                    if (e.status() == Snippet.Status.REJECTED) {
                        StringBuilder msg = new StringBuilder();
                        js.diagnostics(s).forEach(d -> {
                            if (msg.length() > 0) msg.append('\n');
                            msg.append(d.getMessage(Locale.ROOT));
                        });
                        String m = msg.length() > 0 ? msg.toString() : "the snippet does not compile";
                        error(id, "CompilationError", m, m + "\n" + s.source());
                        return;
                    }
                    if (e.exception() != null) {
                        reportException(id, e.exception());
                        return;
                    }
                    boolean expression = s.kind() == Snippet.Kind.EXPRESSION
                            || s.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND;
                    if (expression && e.value() != null) {
                        String type = s instanceof VarSnippet ? ((VarSnippet) s).typeName()
                                : s instanceof ExpressionSnippet ? ((ExpressionSnippet) s).typeName() : "";
                        lastValue = type.equals("String") || type.equals("java.lang.String")
                                ? unquote(e.value()) : e.value();
                    }
                }
            }
        } finally {
            running.set(false);
        }
        if (lastValue != null) {
            System.out.flush();
            OUT.end();
            Map<String, Object> ev = event("result", id);
            Map<String, Object> data = new LinkedHashMap<>();
            data.put("text/plain", lastValue);
            ev.put("data", data);
            ev.put("is_main_result", true);
            send(ev);
        }
    }

    static void reportException(String id, JShellException x) {
        String name = x.getClass().getSimpleName();
        String value = x.getMessage();
        if (x instanceof EvalException) {
            String cls = ((EvalException) x).getExceptionClassName();
            name = cls.substring(cls.lastIndexOf('.') + 1);
        } else if (x instanceof UnresolvedReferenceException) {
            value = "unresolved reference: " + ((UnresolvedReferenceException) x).getSnippet().source().strip();
        }
        StringWriter tb = new StringWriter();
        tb.append(name).append(value == null ? "" : ": " + value).append('\n');
        for (StackTraceElement f : x.getStackTrace()) {
            if (f.getClassName().startsWith("REPL.")) tb.append("\tat ").append(f.toString()).append('\n');
        }
        error(id, name, value, tb.toString().strip());
    }

    /** A Java string literal as jshell shows a String value, back to the string. */
    static String unquote(String lit) {
        if (lit.length() < 2 || lit.charAt(0) != '"' || lit.charAt(lit.length() - 1) != '"') return lit;
        StringBuilder b = new StringBuilder();
        for (int i = 1; i < lit.length() - 1; i++) {
            char c = lit.charAt(i);
            if (c != '\\' || i + 1 >= lit.length() - 1) {
                b.append(c);
                continue;
            }
            char n = lit.charAt(++i);
            switch (n) {
                case 'n': b.append('\n'); break;
                case 't': b.append('\t'); break;
                case 'r': b.append('\r'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case '0': b.append('\0'); break;
                case 'u':
                    if (i + 4 < lit.length()) {
                        b.append((char) Integer.parseInt(lit.substring(i + 1, i + 5), 16));
                        i += 4;
                    }
                    break;
                default: b.append(n);
            }
        }
        return b.toString();
    }

    /** The JSON this kernel reads and writes: objects, arrays, strings, numbers, literals. */
    static final class Json {
        final String s;
        int i;

        Json(String s) {
            this.s = s;
        }

        static Object parse(String s) {
            Json p = new Json(s);
            Object v = p.value();
            p.ws();
            if (p.i != s.length()) throw new IllegalArgumentException("trailing characters at " + p.i);
            return v;
        }

        void ws() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++;
        }

        char peek() {
            ws();
            if (i >= s.length()) throw new IllegalArgumentException("unexpected end");
            return s.charAt(i);
        }

        void expect(char c) {
            if (peek() != c) throw new IllegalArgumentException("expected '" + c + "' at " + i);
            i++;
        }

        Object value() {
            char c = peek();
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                if (peek() == '}') {
                    i++;
                    return m;
                }
                while (true) {
                    String k = string();
                    expect(':');
                    m.put(k, value());
                    if (peek() == ',') {
                        i++;
                        continue;
                    }
                    expect('}');
                    return m;
                }
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                if (peek() == ']') {
                    i++;
                    return l;
                }
                while (true) {
                    l.add(value());
                    if (peek() == ',') {
                        i++;
                        continue;
                    }
                    expect(']');
                    return l;
                }
            }
            if (c == '"') return string();
            for (String lit : new String[] {"true", "false", "null"}) {
                if (s.startsWith(lit, i)) {
                    i += lit.length();
                    return lit.equals("null") ? null : Boolean.valueOf(lit);
                }
            }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            if (start == i) throw new IllegalArgumentException("unexpected '" + c + "' at " + i);
            return Double.valueOf(s.substring(start, i));
        }

        String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                if (i >= s.length()) throw new IllegalArgumentException("unterminated string");
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                if (i >= s.length()) throw new IllegalArgumentException("unterminated string");
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break;
                    case 't': b.append('\t'); break;
                    case 'r': b.append('\r'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'u':
                        if (i + 4 > s.length()) throw new IllegalArgumentException("bad \\u escape");
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                        break;
                    default: b.append(e);
                }
            }
        }

        static String write(Object v) {
            StringBuilder b = new StringBuilder();
            write(b, v);
            return b.toString();
        }

        static void write(StringBuilder b, Object v) {
            if (v == null) {
                b.append("null");
            } else if (v instanceof Map) {
                b.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    if (!first) b.append(',');
                    first = false;
                    write(b, String.valueOf(e.getKey()));
                    b.append(':');
                    write(b, e.getValue());
                }
                b.append('}');
            } else if (v instanceof Number || v instanceof Boolean) {
                b.append(v);
            } else {
                String s = v.toString();
                b.append('"');
                for (int k = 0; k < s.length(); k++) {
                    char c = s.charAt(k);
                    switch (c) {
                        case '"': b.append("\\\""); break;
                        case '\\': b.append("\\\\"); break;
                        case '\n': b.append("\\n"); break;
                        case '\r': b.append("\\r"); break;
                        case '\t': b.append("\\t"); break;
                        default:
                            if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                            else b.append(c);
                    }
                }
                b.append('"');
            }
        }
    }
}
