package org.fedper.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.IOException;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * A round fits WorkManager's 10 minutes: every wait (backoff, Retry-After, an HTTP exchange that
 * hangs) counts against one budget, and the loop ends with OutOfTime before the budget is spent.
 */
public class RoundBudgetTest {
  @Rule public TemporaryFolder tmp = new TemporaryFolder();

  /** Simulated time: sleeping and waiting on the network advance it. */
  static final class FakeClock implements RoundBudget.Clock {
    long nanos;

    @Override public long nanoTime() {
      return nanos;
    }

    void advance(double seconds) {
      nanos += (long) (seconds * 1e9);
    }
  }

  /** A server that accepts the connection and never answers: each exchange lasts its whole timeout. */
  static final class Hanging implements HttpTransport {
    final FakeClock clock;
    final List<Integer> timeouts = new ArrayList<>();

    Hanging(FakeClock clock) {
      this.clock = clock;
    }

    @Override public Response send(String method, String url, Map<String, String> headers, byte[] body) {
      throw new AssertionError("the client must pass each exchange's timeout");
    }

    @Override public Response send(String method, String url, Map<String, String> headers, byte[] body, int timeoutMillis)
        throws IOException {
      timeouts.add(timeoutMillis);
      clock.advance(timeoutMillis / 1000.0);
      throw new java.net.SocketTimeoutException("Read timed out");
    }
  }

  @Test
  public void aHangingServerEndsTheRoundWithinItsBudget() throws Exception {
    // The phone's settings: 8 minutes, 8 attempts of up to 120 s each with backoff, waits of 60 s
    // between task requests. Before the budget, one GET /v1/task alone took 8 x 120 s.
    FakeClock clock = new FakeClock();
    RoundBudget budget = new RoundBudget(480, clock, clock::advance);
    Hanging http = new Hanging(clock);
    ProtocolClient client = new ProtocolClient("http://10.0.2.2:8000", http, Backoff.standard(), new Random(0), budget);
    client.setToken("t");
    RoundLoop loop = new RoundLoop(client, new DeviceStore(tmp.getRoot().toPath()), m -> null, (d, m) -> null,
        budget, 60, 0);
    assertThrows(ProtocolException.OutOfTime.class, () -> loop.run(1));
    assertTrue("simulated seconds: " + clock.nanos / 1e9, clock.nanos <= 480e9);
    assertTrue(http.timeouts.toString(), http.timeouts.size() >= 4);
    int last = http.timeouts.get(http.timeouts.size() - 1);
    assertTrue("the last exchange got only what was left: " + http.timeouts, last < 120_000);
  }

  @Test
  public void aWaitThatWouldOverrunIsNotSleptAtAll() throws Exception {
    FakeClock clock = new FakeClock();
    List<Double> slept = new ArrayList<>();
    RoundBudget budget = new RoundBudget(100, clock, s -> {
      slept.add(s);
      clock.advance(s);
    });
    budget.sleep(40, "a Retry-After");
    ProtocolException.OutOfTime ex = assertThrows(ProtocolException.OutOfTime.class, () -> budget.sleep(70, "another"));
    assertTrue(ex.getMessage(), ex.getMessage().contains("another"));
    assertEquals(List.of(40.0), slept);
    assertEquals(60_000, budget.timeoutMillis(120_000, "GET /v1/task"));
    clock.advance(60);
    assertThrows(ProtocolException.OutOfTime.class, () -> budget.check("training"));
  }

  @Test
  public void aRealServerThatNeverAnswersIsLeftWhenTheBudgetEnds() throws Exception {
    // A real socket: the connection is accepted (the backlog does it) and nothing is ever sent.
    ServerSocket silent = new ServerSocket(0);
    {
      List<Socket> held = new ArrayList<>();
      Thread acceptor = new Thread(() -> {
        try {
          while (true) {
            held.add(silent.accept());
          }
        } catch (IOException closed) {
          // the test is over
        }
      });
      acceptor.start();
      RoundBudget budget = new RoundBudget(2, RoundBudget.Clock.SYSTEM, Backoff.Sleeper.REAL);
      ProtocolClient client = new ProtocolClient("http://127.0.0.1:" + silent.getLocalPort(),
          new HttpTransport.UrlConnection(ProtocolClient.DEFAULT_TIMEOUT_MILLIS), Backoff.standard(), new Random(0), budget);
      RoundLoop loop = new RoundLoop(client, new DeviceStore(tmp.getRoot().toPath()), m -> null, (d, m) -> null,
          budget, 60, 0);
      ExecutorService run = Executors.newSingleThreadExecutor();
      try {
        Future<?> round = run.submit(() -> loop.run(1));
        // Without the budget this would wait 8 x 120 s; a minute means it did not stop.
        java.util.concurrent.ExecutionException ex =
            assertThrows(java.util.concurrent.ExecutionException.class, () -> round.get(60, TimeUnit.SECONDS));
        assertTrue(String.valueOf(ex.getCause()), ex.getCause() instanceof ProtocolException.OutOfTime);
      } finally {
        run.shutdownNow();
        silent.close();
        acceptor.join();
        for (Socket s : held) {
          s.close();
        }
      }
    }
  }
}
