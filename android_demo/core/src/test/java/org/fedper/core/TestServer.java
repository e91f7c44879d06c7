package org.fedper.core;

import static org.junit.Assert.assertTrue;

import java.io.File;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** A real `fedper serve` process on a free port of 127.0.0.1, on one of the fixture exports. */
final class TestServer {
  static final String ADMIN = "admin-token-for-java-tests-0123456789";
  static final String ENROLL = "enrollment-key-for-java-tests";

  final String url;
  private final Process process;
  private final Path log;

  /** Starts it on fixtures export NAME with a new data dir under tmp, and waits until it answers. */
  TestServer(Path tmp, String export, int rounds, int clients, String... extra) throws Exception {
    int port;
    try (ServerSocket s = new ServerSocket(0)) {
      port = s.getLocalPort();
    }
    url = "http://127.0.0.1:" + port;
    Path data = Files.createTempDirectory(tmp, "server");
    log = data.resolveSibling(data.getFileName() + ".log");
    List<String> command = new ArrayList<>(Arrays.asList(HostFixtures.python(), "-m", "fedper.cli", "serve",
        "--artifacts", HostFixtures.dir().resolve(export).toString(),
        "--data-dir", data.resolve("server").toString(), "--port", Integer.toString(port),
        "--rounds", Integer.toString(rounds), "--target-clients", Integer.toString(clients),
        "--min-clients", Integer.toString(clients), "--round-timeout", "0", "--retry-after", "1"));
    command.addAll(Arrays.asList(extra));
    ProcessBuilder pb = new ProcessBuilder(command);
    pb.environment().put("FEDPER_ADMIN_TOKEN", ADMIN);
    pb.environment().put("FEDPER_ENROLLMENT_KEY", ENROLL);
    pb.redirectErrorStream(true).redirectOutput(new File(log.toString()));
    process = pb.start();
    HttpTransport http = new HttpTransport.UrlConnection(2000);
    for (int i = 0; i < 300; i++) {
      assertTrue("server exited: " + log(), process.isAlive());
      try {
        if (http.send("GET", url + "/v1/health", Collections.emptyMap(), null).status == 200) {
          return;
        }
      } catch (java.io.IOException notYet) {
        Thread.sleep(200);
      }
    }
    stop();
    throw new AssertionError("server did not start: " + log());
  }

  String log() throws Exception {
    return new String(Files.readAllBytes(log), StandardCharsets.UTF_8);
  }

  /** An operator call (admin token). */
  HttpTransport.Response admin(String method, String path) throws Exception {
    Map<String, String> headers = new LinkedHashMap<>();
    headers.put("Authorization", "Bearer " + ADMIN);
    return new HttpTransport.UrlConnection(30_000).send(method, url + path, headers, method.equals("POST") ? new byte[0] : null);
  }

  void stop() throws Exception {
    process.destroy();
    process.waitFor();
  }
}
