package org.fedper.core;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URL;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Timer;
import java.util.TimerTask;

/**
 * One HTTP exchange. The default implementation uses HttpURLConnection, which both the JVM and
 * Android have (java.net.http does not exist on Android); tests may substitute their own.
 */
public interface HttpTransport {
  Response send(String method, String url, Map<String, String> headers, byte[] body) throws IOException;

  /**
   * The same exchange, given up (IOException) after timeoutMillis in all: ProtocolClient passes
   * what is left of the round's budget. A transport without a clock of its own ignores it.
   */
  default Response send(String method, String url, Map<String, String> headers, byte[] body, int timeoutMillis)
      throws IOException {
    return send(method, url, headers, body);
  }

  /** Status, lower-cased headers and body. */
  final class Response {
    public final int status;
    public final Map<String, String> headers;
    public final byte[] body;

    public Response(int status, Map<String, String> headers, byte[] body) {
      this.status = status;
      this.headers = headers;
      this.body = body;
    }

    public String header(String name) {
      return headers.get(name.toLowerCase(Locale.ROOT));
    }
  }

  /**
   * The platform's HttpURLConnection. Its connect and read timeouts bound each step, not the
   * exchange (a server trickling a byte a minute never trips them), so a watchdog also
   * disconnects it when the whole exchange has taken timeoutMillis.
   */
  final class UrlConnection implements HttpTransport {
    private static final Timer WATCHDOG = new Timer("fedper-http-watchdog", true);
    private final int timeoutMillis;

    public UrlConnection(int timeoutMillis) {
      this.timeoutMillis = timeoutMillis;
    }

    @Override
    public Response send(String method, String url, Map<String, String> headers, byte[] body)
        throws IOException {
      return send(method, url, headers, body, timeoutMillis);
    }

    @Override
    public Response send(String method, String url, Map<String, String> headers, byte[] body, int timeoutMillis)
        throws IOException {
      HttpURLConnection c = (HttpURLConnection) new URL(url).openConnection();
      TimerTask cut = new TimerTask() {
        @Override
        public void run() {
          c.disconnect();
        }
      };
      WATCHDOG.schedule(cut, timeoutMillis);
      try {
        c.setRequestMethod(method);
        c.setConnectTimeout(timeoutMillis);
        c.setReadTimeout(timeoutMillis);
        c.setUseCaches(false);
        for (Map.Entry<String, String> h : headers.entrySet()) {
          c.setRequestProperty(h.getKey(), h.getValue());
        }
        if (body != null) {
          c.setDoOutput(true);
          c.setFixedLengthStreamingMode(body.length);
          try (OutputStream out = c.getOutputStream()) {
            out.write(body);
          }
        }
        int status = c.getResponseCode();
        Map<String, String> responseHeaders = new LinkedHashMap<>();
        for (Map.Entry<String, List<String>> h : c.getHeaderFields().entrySet()) {
          if (h.getKey() != null && !h.getValue().isEmpty()) {
            responseHeaders.put(h.getKey().toLowerCase(Locale.ROOT), h.getValue().get(0));
          }
        }
        InputStream in = status >= 400 ? c.getErrorStream() : c.getInputStream();
        return new Response(status, responseHeaders, in == null ? new byte[0] : readAll(in));
      } finally {
        cut.cancel();
        c.disconnect();
      }
    }

    private static byte[] readAll(InputStream in) throws IOException {
      try (InputStream s = in) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] buf = new byte[1 << 16];
        int n;
        while ((n = s.read(buf)) > 0) {
          out.write(buf, 0, n);
        }
        return out.toByteArray();
      }
    }
  }
}
