// Sheepfold Java kernel driver: jshell's engine (jdk.jshell) in this JVM,
// its snippets run on a thread of their own (the "local" execution
// engine), so that state is kept between executions without a second JVM.
// Requests arrive on fd 3 as lines of space-separated fields: the marker,
// then hex-encoded UTF-8: the code and, in pairs, the execution's env;
// messages leave on fd 4 as JSON lines. stdout and stderr are the real fds.
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import jdk.jshell.*;

public class SheepfoldJavaDriver {
    static final int MAX_RESULT = 3500000;
    static PrintStream msg;
    static volatile JShell shell;

    public static void main(String[] args) throws Exception {
        msg = new PrintStream(new FileOutputStream("/proc/self/fd/4"), true, StandardCharsets.UTF_8);
        BufferedReader req = new BufferedReader(new InputStreamReader(new FileInputStream("/proc/self/fd/3"), StandardCharsets.UTF_8));
        // E2B's Java kernel shows the sandbox's environment as system
        // properties (System.getProperty("NAME")); a running JVM's
        // environment cannot change, so an execution's env is given so too.
        for (Map.Entry<String, String> e : System.getenv().entrySet()) {
            if (System.getProperty(e.getKey()) == null) System.setProperty(e.getKey(), e.getValue());
        }
        System.setOut(new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8));
        System.setErr(new PrintStream(new FileOutputStream(FileDescriptor.err), true, StandardCharsets.UTF_8));
        shell = JShell.builder().executionEngine("local").out(System.out).err(System.err).build();
        // SIGINT (a timeout, an interrupt) stops the running snippet; the
        // JVM's own handler would end the JVM and its state.
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), s -> { JShell j = shell; if (j != null) j.stop(); });
        String line;
        while ((line = req.readLine()) != null) {
            String[] f = line.split(" ", -1);
            String marker = f[0];
            String code = f.length > 1 ? unhex(f[1]) : "";
            Map<String, String> saved = new LinkedHashMap<>();
            for (int i = 3; i < f.length; i += 2) {
                String k = unhex(f[i]);
                saved.put(k, System.getProperty(k));
                System.setProperty(k, i + 1 < f.length ? unhex(f[i + 1]) : "");
            }
            try {
                run(code);
            } catch (Throwable t) {
                error(t.getClass().getSimpleName(), String.valueOf(t.getMessage()), stackText(t));
            } finally {
                for (Map.Entry<String, String> e : saved.entrySet()) {
                    if (e.getValue() == null) System.clearProperty(e.getKey());
                    else System.setProperty(e.getKey(), e.getValue());
                }
                System.out.flush();
                System.err.flush();
                byte[] end = ("\u001e" + marker + "\n").getBytes(StandardCharsets.UTF_8);
                FileOutputStream o = new FileOutputStream(FileDescriptor.out), e = new FileOutputStream(FileDescriptor.err);
                o.write(end);
                e.write(end);
                send("{\"type\":\"done\"}");
            }
        }
        System.exit(0);
    }

    // run evaluates a cell snippet by snippet, as jshell does; the value of
    // the last expression is the cell's result; the first failure ends it.
    static void run(String code) {
        SourceCodeAnalysis sca = shell.sourceCodeAnalysis();
        String rest = code;
        String value = null;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
            String src = ci.source();
            if (ci.completeness() == SourceCodeAnalysis.Completeness.DEFINITELY_INCOMPLETE
                    || ci.completeness() == SourceCodeAnalysis.Completeness.CONSIDERED_INCOMPLETE && src == null) {
                src = rest; // let the compiler say what is missing
                rest = "";
            } else if (src == null || ci.completeness() == SourceCodeAnalysis.Completeness.EMPTY) {
                break;
            } else {
                rest = ci.remaining();
            }
            value = null;
            for (SnippetEvent ev : shell.eval(src)) {
                if (ev.causeSnippet() != null) continue; // an update of a dependent snippet
                if (ev.exception() != null) {
                    thrown(ev.exception());
                    return;
                }
                if (ev.status() == Snippet.Status.REJECTED) {
                    StringBuilder tb = new StringBuilder();
                    String first = null;
                    for (Diag d : (Iterable<Diag>) shell.diagnostics(ev.snippet())::iterator) {
                        if (!d.isError()) continue;
                        String m = d.getMessage(Locale.ROOT);
                        if (first == null) first = m;
                        long line = lineOf(ev.snippet().source(), d.getStartPosition());
                        tb.append("line ").append(line).append(": ").append(m).append('\n');
                    }
                    if (first == null) first = "the snippet was rejected: " + ev.snippet().source().strip();
                    error("CompilationError", first, tb.toString());
                    return;
                }
                Snippet sn = ev.snippet();
                if (ev.value() != null && sn instanceof VarSnippet vs && sn.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND) {
                    value = unquote(ev.value(), vs.typeName());
                } else if (ev.value() != null && sn instanceof ExpressionSnippet es) {
                    value = unquote(ev.value(), es.typeName());
                }
            }
        }
        if (value != null) {
            send("{\"type\":\"result\",\"result\":{\"text\":" + json(value) + ",\"is_main_result\":true}}");
        }
    }

    static long lineOf(String src, long pos) {
        long n = 1;
        for (int i = 0; i < Math.min(pos, src.length()); i++) if (src.charAt(i) == '\n') n++;
        return n;
    }

    static void thrown(JShellException e) {
        if (e instanceof EvalException ee) {
            String name = ee.getExceptionClassName();
            error(name.substring(name.lastIndexOf('.') + 1), String.valueOf(ee.getMessage()), name + ": " + ee.getMessage() + "\n" + frames(ee));
        } else if (e instanceof UnresolvedReferenceException ure) {
            error("UnresolvedReferenceException", "the snippet uses " + ure.getSnippet().source().strip() + ", which is not defined yet", frames(e));
        } else {
            error(e.getClass().getSimpleName(), String.valueOf(e.getMessage()), frames(e));
        }
    }

    // frames are the user's: jshell's and the driver's own are left out.
    static String frames(Throwable t) {
        StringBuilder b = new StringBuilder();
        for (StackTraceElement el : t.getStackTrace()) {
            String c = el.getClassName();
            if (c.startsWith("jdk.jshell.") || c.startsWith("jdk.internal.reflect.") || c.startsWith("java.lang.reflect.")
                    || c.equals(SheepfoldJavaDriver.class.getName())) continue;
            b.append("\tat ").append(el).append('\n');
        }
        return b.toString();
    }

    static String stackText(Throwable t) {
        StringWriter w = new StringWriter();
        t.printStackTrace(new PrintWriter(w));
        return w.toString();
    }

    static void error(String name, String value, String traceback) {
        String clip = traceback.length() > 524288 ? traceback.substring(0, 524288) + "... [cut]" : traceback;
        String v = value.length() > 65536 ? value.substring(0, 65536) + "... [cut]" : value;
        send("{\"type\":\"error\",\"error\":{\"name\":" + json(name) + ",\"value\":" + json(v) + ",\"traceback\":" + json(clip) + "}}");
    }

    static void send(String s) {
        byte[] b = s.getBytes(StandardCharsets.UTF_8);
        if (b.length > MAX_RESULT) {
            String what = s.startsWith("{\"type\":\"error\"") ? "error" : "result";
            s = "{\"type\":\"dropped\",\"what\":\"" + what + "\",\"bytes\":" + b.length + ",\"limit\":" + MAX_RESULT + "}";
        }
        synchronized (msg) {
            msg.print(s + "\n");
            msg.flush();
        }
    }

    // unquote turns jshell's rendering of a String or char value ("a\"b")
    // into the value itself, as E2B's Java kernel shows it.
    static String unquote(String v, String type) {
        boolean str = type.equals("String") || type.equals("java.lang.String");
        boolean chr = type.equals("char") || type.equals("Character") || type.equals("java.lang.Character");
        if (!(str && v.length() >= 2 && v.startsWith("\"") && v.endsWith("\"")
                || chr && v.length() >= 3 && v.startsWith("'") && v.endsWith("'"))) return v;
        StringBuilder b = new StringBuilder();
        for (int i = 1; i < v.length() - 1; i++) {
            char c = v.charAt(i);
            if (c != '\\' || i + 1 >= v.length() - 1) { b.append(c); continue; }
            char n = v.charAt(++i);
            switch (n) {
                case 'n' -> b.append('\n');
                case 't' -> b.append('\t');
                case 'r' -> b.append('\r');
                case 'b' -> b.append('\b');
                case 'f' -> b.append('\f');
                case 'u' -> {
                    if (i + 4 < v.length()) { b.append((char) Integer.parseInt(v.substring(i + 1, i + 5), 16)); i += 4; }
                }
                default -> {
                    if (n >= '0' && n <= '7') {
                        int j = i, val = 0;
                        while (j < v.length() - 1 && j < i + 3 && v.charAt(j) >= '0' && v.charAt(j) <= '7') val = val * 8 + (v.charAt(j++) - '0');
                        b.append((char) val);
                        i = j - 1;
                    } else b.append(n);
                }
            }
        }
        return b.toString();
    }

    static String unhex(String h) {
        byte[] b = new byte[h.length() / 2];
        for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16);
        return new String(b, StandardCharsets.UTF_8);
    }

    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20 || Character.isSurrogate(c) && !validSurrogate(s, i)) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
                }
            }
        }
        return b.append('"').toString();
    }

    static boolean validSurrogate(String s, int i) {
        char c = s.charAt(i);
        if (Character.isHighSurrogate(c)) return i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1));
        return i > 0 && Character.isHighSurrogate(s.charAt(i - 1));
    }
}
