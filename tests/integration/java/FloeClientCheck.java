// Drives the official Apache Kafka Java client (kafka-clients 3.9.x) against a floe broker.
//
// Single-file program: run it with `java -cp 'lib/*' FloeClientCheck.java BOOTSTRAP MODE ARGS...`.
//
// Modes:
//   roundtrip CODEC N TOPIC      create TOPIC (3 partitions), produce N records with
//                                compression.type=CODEC, read them back, print them
//   roundtrip-all N PREFIX [CODEC...]
//                                the same for every codec (default none gzip snappy lz4 zstd) in
//                                one JVM, topic PREFIX-CODEC; a failing codec does not stop the
//                                others (it prints an ERROR line), the exit status is 1 if any failed
//   admin TOPIC                  create/describe/alter/extend/delete topics, list topics and look
//                                up offsets by timestamp on TOPIC-ts; prints one line per result
//
// The records are those of tests/integration/workload.py expected_records(N, 3, tag=CODEC).
// Output (stdout, tab-separated; binary fields base64, "-" for null):
//   REC  TAG PARTITION OFFSET TIMESTAMP TIMESTAMP_TYPE KEY VALUE HEADERS
//        HEADERS is a comma-separated list of KEY:VALUE, each base64 (VALUE "-" when null)
//   ACK  TAG SEQ PARTITION OFFSET TIMESTAMP       the producer's RecordMetadata for record SEQ
//   DONE TAG PRODUCED CONSUMED
//   ERROR TAG EXCEPTION_CLASS MESSAGE              (roundtrip-all; stack trace on stderr)
// Progress goes to stderr as "STEP ..." lines. Any other exception: stack trace, exit status 1.

import java.io.BufferedOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.ListTopicsOptions;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class FloeClientCheck {
    static final long BASE_TS_MS = 1_700_000_000_000L;
    static final int PARTITIONS = 3;
    static final List<String> CODECS = List.of("none", "gzip", "snappy", "lz4", "zstd");
    // roundtrip-all stops starting new codecs after this long, so a broken broker cannot
    // push the whole run past the caller's timeout; skipped codecs print an ERROR line
    static final long ALL_BUDGET_MS = 90_000;
    static final long CONSUME_DEADLINE_MS = 30_000;

    static PrintStream out;
    static final Base64.Encoder B64 = Base64.getEncoder();

    public static void main(String[] args) {
        out = new PrintStream(
                new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 16),
                false, StandardCharsets.UTF_8);
        int rc;
        try {
            rc = run(args);
        } catch (Throwable t) {
            out.flush();
            System.err.println("FAILED: " + t);
            t.printStackTrace();
            rc = 1;
        }
        out.flush();
        System.exit(rc);
    }

    static int run(String[] args) throws Exception {
        if (args.length < 2) {
            return usage();
        }
        String bootstrap = args[0];
        String mode = args[1];
        switch (mode) {
            case "roundtrip": {
                if (args.length != 5) {
                    return usage();
                }
                roundtrip(bootstrap, args[2], Integer.parseInt(args[3]), args[4]);
                return 0;
            }
            case "roundtrip-all": {
                if (args.length < 4) {
                    return usage();
                }
                int n = Integer.parseInt(args[2]);
                String prefix = args[3];
                List<String> codecs = args.length > 4
                        ? Arrays.asList(args).subList(4, args.length) : CODECS;
                long start = System.currentTimeMillis();
                int failed = 0;
                for (String codec : codecs) {
                    if (System.currentTimeMillis() - start > ALL_BUDGET_MS) {
                        out.println(String.join("\t", "ERROR", codec, "Skipped",
                                "time budget of roundtrip-all used up by earlier codecs"));
                        failed++;
                        continue;
                    }
                    try {
                        roundtrip(bootstrap, codec, n, prefix + "-" + codec);
                    } catch (Exception e) {
                        failed++;
                        Throwable root = unwrap(e);
                        out.println(String.join("\t", "ERROR", codec, root.getClass().getName(),
                                oneLine(String.valueOf(root.getMessage()))));
                        out.flush();
                        System.err.println("FAILED codec " + codec + ": " + e);
                        e.printStackTrace();
                    }
                }
                return failed == 0 ? 0 : 1;
            }
            case "admin": {
                if (args.length != 3) {
                    return usage();
                }
                admin(bootstrap, args[2]);
                return 0;
            }
            default:
                return usage();
        }
    }

    static int usage() {
        System.err.println("usage: FloeClientCheck BOOTSTRAP roundtrip CODEC N TOPIC\n"
                + "       FloeClientCheck BOOTSTRAP roundtrip-all N TOPIC_PREFIX [CODEC...]\n"
                + "       FloeClientCheck BOOTSTRAP admin TOPIC");
        return 2;
    }

    static void step(String what) {
        System.err.println("STEP " + what);
    }

    static Throwable unwrap(Throwable t) {
        while (t instanceof ExecutionException && t.getCause() != null) {
            t = t.getCause();
        }
        return t;
    }

    static String oneLine(String s) {
        return s.replace('\t', ' ').replace('\n', ' ').replace('\r', ' ');
    }

    static String b64(byte[] b) {
        return b == null ? "-" : B64.encodeToString(b);
    }

    // ---------------------------------------------------------------------------- clients

    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.CLIENT_ID_CONFIG, "floe-java-check-admin");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        return Admin.create(p);
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap, String codec) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "floe-java-check-producer-" + codec);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap, String name) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "floe-java-check-consumer-" + name);
        // no group.id: assign() only, nothing committed
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG,
                ByteArrayDeserializer.class.getName());
        return new KafkaConsumer<>(p);
    }

    // ---------------------------------------------------------------------------- roundtrip

    static void roundtrip(String bootstrap, String codec, int n, String topic) throws Exception {
        step("roundtrip " + codec + ": CreateTopics " + topic);
        try (Admin admin = admin(bootstrap)) {
            admin.createTopics(List.of(new NewTopic(topic, PARTITIONS, (short) 1))).all().get();
        }

        step("roundtrip " + codec + ": Produce " + n + " records");
        long[] ackOffset = new long[n];
        int[] ackPartition = new int[n];
        long[] ackTimestamp = new long[n];
        AtomicReference<Exception> sendError = new AtomicReference<>();
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, codec)) {
            for (int i = 0; i < n; i++) {
                final int seq = i;
                RecordHeaders headers = new RecordHeaders();
                headers.add("seq", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                headers.add("codec", codec.getBytes(StandardCharsets.UTF_8));
                ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(
                        topic, i % PARTITIONS, BASE_TS_MS + i,
                        ("key-" + codec + "-" + i).getBytes(StandardCharsets.UTF_8),
                        ("value-" + codec + "-" + i + "-" + "x".repeat(i % 97))
                                .getBytes(StandardCharsets.UTF_8),
                        headers);
                producer.send(rec, (RecordMetadata md, Exception e) -> {
                    if (e != null) {
                        sendError.compareAndSet(null, e);
                    } else {
                        ackPartition[seq] = md.partition();
                        ackOffset[seq] = md.offset();
                        ackTimestamp[seq] = md.timestamp();
                    }
                });
            }
            producer.flush();
        }
        if (sendError.get() != null) {
            throw new RuntimeException("produce (" + codec + ") failed", sendError.get());
        }
        for (int i = 0; i < n; i++) {
            out.println("ACK\t" + codec + "\t" + i + "\t" + ackPartition[i] + "\t" + ackOffset[i]
                    + "\t" + ackTimestamp[i]);
        }

        step("roundtrip " + codec + ": Fetch");
        int consumed = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, codec)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int p = 0; p < PARTITIONS; p++) {
                tps.add(new TopicPartition(topic, p));
            }
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps);
            long deadline = System.currentTimeMillis() + CONSUME_DEADLINE_MS;
            while (!caughtUp(consumer, tps, end)) {
                if (System.currentTimeMillis() > deadline) {
                    Map<TopicPartition, Long> pos = new HashMap<>();
                    for (TopicPartition tp : tps) {
                        pos.put(tp, consumer.position(tp));
                    }
                    throw new RuntimeException("consume (" + codec + ") timed out after "
                            + consumed + " records: positions " + pos + ", end offsets " + end);
                }
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    consumed++;
                    StringBuilder hs = new StringBuilder();
                    for (Header h : r.headers()) {
                        if (hs.length() > 0) {
                            hs.append(',');
                        }
                        hs.append(b64(h.key().getBytes(StandardCharsets.UTF_8)))
                                .append(':').append(b64(h.value()));
                    }
                    out.println(String.join("\t", "REC", codec,
                            Integer.toString(r.partition()), Long.toString(r.offset()),
                            Long.toString(r.timestamp()), r.timestampType().name,
                            b64(r.key()), b64(r.value()), hs));
                }
            }
        }
        out.println(String.join("\t", "DONE", codec, Integer.toString(n),
                Integer.toString(consumed)));
        out.flush();
    }

    static boolean caughtUp(KafkaConsumer<byte[], byte[]> consumer, List<TopicPartition> tps,
                            Map<TopicPartition, Long> end) {
        for (TopicPartition tp : tps) {
            if (consumer.position(tp) < end.get(tp)) {
                return false;
            }
        }
        return true;
    }

    // ---------------------------------------------------------------------------- admin

    static void admin(String bootstrap, String topic) throws Exception {
        String tsTopic = topic + "-ts";
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        try (Admin admin = admin(bootstrap)) {
            step("CreateTopics " + topic + " with configs");
            Map<String, String> configs = new HashMap<>();
            configs.put("retention.ms", "3600000");
            configs.put("cleanup.policy", "delete");
            configs.put("max.message.bytes", "2097152");
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1).configs(configs)))
                    .all().get();
            out.println("CREATED\t" + topic);

            step("CreateTopics " + topic + " again");
            try {
                admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
                out.println("CREATE_AGAIN\tok");
            } catch (ExecutionException e) {
                out.println("CREATE_AGAIN\t" + e.getCause().getClass().getSimpleName());
            }

            step("DescribeConfigs " + topic);
            printConfigs("CONFIG", admin, res);

            step("IncrementalAlterConfigs " + topic);
            Map<ConfigResource, Collection<AlterConfigOp>> ops = Map.of(res, List.of(
                    new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"),
                            AlterConfigOp.OpType.SET),
                    new AlterConfigOp(new ConfigEntry("max.message.bytes", ""),
                            AlterConfigOp.OpType.DELETE)));
            admin.incrementalAlterConfigs(ops).all().get();
            out.println("ALTERED\t" + topic);

            step("DescribeConfigs " + topic + " after alter");
            printConfigs("CONFIG_ALTERED", admin, res);

            step("CreatePartitions " + topic + " to 4");
            admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(4))).all().get();
            step("DescribeTopics " + topic);
            TopicDescription desc = admin.describeTopics(List.of(topic)).allTopicNames().get()
                    .get(topic);
            out.println("PARTITIONS\t" + topic + "\t" + desc.partitions().size());

            step("CreateTopics " + tsTopic);
            admin.createTopics(List.of(new NewTopic(tsTopic, 1, (short) 1))).all().get();

            step("ListTopics before delete");
            out.println("TOPICS_BEFORE\t" + String.join(",", listTopics(admin)));

            step("DeleteTopics " + topic);
            admin.deleteTopics(List.of(topic)).all().get();
            // deletion is asynchronous in Kafka: allow the metadata a few seconds to catch up
            Set<String> after = listTopics(admin);
            for (int i = 0; i < 50 && after.contains(topic); i++) {
                Thread.sleep(200);
                after = listTopics(admin);
            }
            out.println("TOPICS_AFTER\t" + String.join(",", after));

            offsetsForTimes(bootstrap, admin, tsTopic);
        }
    }

    static Set<String> listTopics(Admin admin) throws Exception {
        return new TreeSet<>(admin.listTopics(new ListTopicsOptions().listInternal(false))
                .names().get());
    }

    static void printConfigs(String tag, Admin admin, ConfigResource res) throws Exception {
        Config cfg = admin.describeConfigs(List.of(res)).all().get().get(res);
        for (ConfigEntry e : cfg.entries()) {
            out.println(String.join("\t", tag, e.name(), String.valueOf(e.value()),
                    e.source().name(), Boolean.toString(e.isReadOnly())));
        }
    }

    // ten records at BASE_TS_MS + 1000*i, i = 0..9, then look them up by timestamp
    static void offsetsForTimes(String bootstrap, Admin admin, String tsTopic) throws Exception {
        step("Produce 10 records to " + tsTopic);
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, "none")) {
            for (int i = 0; i < 10; i++) {
                producer.send(new ProducerRecord<>(tsTopic, 0, BASE_TS_MS + 1000L * i,
                        ("k" + i).getBytes(StandardCharsets.UTF_8),
                        ("v" + i).getBytes(StandardCharsets.UTF_8))).get();
            }
        }
        TopicPartition tp = new TopicPartition(tsTopic, 0);
        long[] queries = {BASE_TS_MS - 5000, BASE_TS_MS, BASE_TS_MS + 3500, BASE_TS_MS + 9000,
                          BASE_TS_MS + 9001};
        step("Consumer offsetsForTimes " + tsTopic);
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap, "ts")) {
            for (long q : queries) {
                OffsetAndTimestamp ot = consumer.offsetsForTimes(Map.of(tp, q)).get(tp);
                out.println("OFFSET_FOR_TIME\t" + q + "\t"
                        + (ot == null ? "null\tnull" : ot.offset() + "\t" + ot.timestamp()));
            }
            out.println("BEGINNING\t" + consumer.beginningOffsets(List.of(tp)).get(tp));
            out.println("END\t" + consumer.endOffsets(List.of(tp)).get(tp));
        }
        step("Admin listOffsets " + tsTopic);
        Map<String, OffsetSpec> specs = new java.util.LinkedHashMap<>();
        specs.put("earliest", OffsetSpec.earliest());
        specs.put("latest", OffsetSpec.latest());
        specs.put("ts" + (BASE_TS_MS + 3500), OffsetSpec.forTimestamp(BASE_TS_MS + 3500));
        for (Map.Entry<String, OffsetSpec> s : specs.entrySet()) {
            ListOffsetsResult.ListOffsetsResultInfo info =
                    admin.listOffsets(Map.of(tp, s.getValue())).partitionResult(tp).get();
            out.println("LIST_OFFSETS\t" + s.getKey() + "\t" + info.offset() + "\t"
                    + info.timestamp());
        }
    }
}
