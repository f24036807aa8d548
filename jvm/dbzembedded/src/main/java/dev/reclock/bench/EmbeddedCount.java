package dev.reclock.bench;

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.embedded.Connect;
import java.io.FileReader;
import java.io.IOException;
import java.io.Reader;
import java.lang.management.ManagementFactory;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.connect.source.SourceRecord;

/**
 * Runs Debezium's embedded engine over each replication slot named, one after the other in this JVM, and
 * counts the change records it delivers (Connect's {@code SourceRecord}s, nothing serialized: the cheapest way
 * to consume the engine) until {@code expected} have come, then closes it.
 *
 * <pre>java -cp 'DIR/*' dev.reclock.bench.EmbeddedCount engine.properties EXPECTED TIMEOUT_S SLOT...</pre>
 *
 * For each slot, one JSON line on stdout: the slot, the seconds from building the engine to the last record
 * counted ({@code seconds}), to the first ({@code first_s}), the records counted, and the JVM's uptime when the
 * engine was built. A record that is not a change event (no value) is counted apart and fails the run; so does
 * a count past {@code expected}, an engine that stops with an error, or the timeout.
 */
public final class EmbeddedCount {
  private EmbeddedCount() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 4) {
      System.err.println("usage: EmbeddedCount engine.properties EXPECTED TIMEOUT_S SLOT...");
      System.exit(2);
    }
    Properties base = new Properties();
    try (Reader r = new FileReader(args[0])) {
      base.load(r);
    }
    long expected = Long.parseLong(args[1]);
    long timeoutS = Long.parseLong(args[2]);
    int rc = 0;
    for (int i = 3; i < args.length; i++) {
      rc |= runOne(base, args[i], expected, timeoutS);
    }
    System.exit(rc);
  }

  private static int runOne(Properties base, String slot, long expected, long timeoutS) throws IOException {
    Properties props = new Properties();
    props.putAll(base);
    props.setProperty("name", "engine-" + slot);
    props.setProperty("slot.name", slot);
    AtomicLong count = new AtomicLong();
    AtomicLong other = new AtomicLong();
    AtomicLong firstNs = new AtomicLong();
    AtomicLong lastNs = new AtomicLong();
    AtomicReference<Throwable> failure = new AtomicReference<>();
    CountDownLatch done = new CountDownLatch(1);
    long uptimeMs = ManagementFactory.getRuntimeMXBean().getUptime();
    long t0 = System.nanoTime();
    DebeziumEngine.ChangeConsumer<RecordChangeEvent<SourceRecord>> consumer = (List<RecordChangeEvent<SourceRecord>> batch,
        DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer) -> {
      for (RecordChangeEvent<SourceRecord> event : batch) {
        SourceRecord rec = event.record();
        if (rec.value() == null) {
          other.incrementAndGet();
        } else {
          long n = count.incrementAndGet();
          if (n == 1) {
            firstNs.set(System.nanoTime());
          }
          if (n == expected) {
            lastNs.set(System.nanoTime());
            done.countDown();
          }
        }
        committer.markProcessed(event);
      }
      committer.markBatchFinished();
    };
    DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
        .using(props)
        .notifying(consumer)
        .using((boolean success, String message, Throwable error) -> {
          if (!success) {
            failure.compareAndSet(null, error != null ? error : new RuntimeException(message));
          }
          done.countDown();
        })
        .build();
    ExecutorService executor = Executors.newSingleThreadExecutor();
    executor.execute(engine);
    boolean reached;
    try {
      reached = done.await(timeoutS, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      reached = false;
    }
    // a moment more: a record past the expected count would show here
    try {
      Thread.sleep(200);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    try {
      engine.close();
    } catch (IllegalStateException alreadyStopped) {
      // the engine stopped by itself (an error, reported through the completion callback)
    }
    executor.shutdown();
    try {
      executor.awaitTermination(60, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    long n = count.get();
    Throwable err = failure.get();
    boolean ok = reached && err == null && n == expected && other.get() == 0 && lastNs.get() != 0;
    System.out.printf("{\"slot\": \"%s\", \"ok\": %s, \"records\": %d, \"other\": %d, \"seconds\": %.6f, "
        + "\"first_s\": %.6f, \"jvm_uptime_s\": %.3f, \"error\": \"%s\"}%n", slot, ok, n, other.get(),
        lastNs.get() == 0 ? -1.0 : (lastNs.get() - t0) / 1e9,
        firstNs.get() == 0 ? -1.0 : (firstNs.get() - t0) / 1e9, uptimeMs / 1000.0,
        err == null ? "" : String.valueOf(err).replace("\\", "\\\\").replace("\"", "'").replace("\n", " "));
    System.out.flush();
    return ok ? 0 : 1;
  }
}
