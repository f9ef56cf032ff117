// Transactions with the official Apache Kafka Java client against a floe broker.
//
// Single-file program: `java -cp 'lib/*' TxnCheck.java BOOTSTRAP TOPIC [timeout]`.
// On TOPIC (2 partitions, created here) a transactional producer commits c-0..c-5, aborts
// a-0..a-3 and commits d-0..d-1; a zombie producer (transactional.id "zombie") opens a
// transaction, a second producer with the same id fences it, and the zombie's commit fails;
// then a read_committed and a read_uncommitted consumer read everything.
// With "timeout": a producer (transaction.timeout.ms 3000) lets its transaction (t-0) expire,
// its next send fails, it waits until its sends are refused (the client has taken the error in),
// aborts and commits r-0 in its next transaction (KIP-588), then the consumers read as above.
// Output (stdout, tab-separated):
//   EXPIRED EXCEPTION_CLASS           what the send after the expiry threw ("none": nothing)
//   FENCED EXCEPTION_CLASS            what the zombie's commit threw
//   REC ISOLATION PARTITION OFFSET VALUE
//   DONE ISOLATION COUNT
// Any unexpected exception: stack trace, exit status 1.

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class TxnCheck {
    static KafkaProducer<byte[], byte[]> producer(String bootstrap, String tid) {
        return producer(bootstrap, tid, new Properties());
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap, String tid, Properties p) {
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, tid);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);
        producer.initTransactions();
        return producer;
    }

    static void send(KafkaProducer<byte[], byte[]> p, String topic, String prefix, int n)
            throws Exception {
        for (int i = 0; i < n; i++) {
            p.send(new ProducerRecord<>(topic, i % 2, null,
                    (prefix + "-" + i).getBytes(StandardCharsets.UTF_8))).get();
        }
    }

    static void read(String bootstrap, String topic, String isolation) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG,
                ByteArrayDeserializer.class.getName());
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
            List<TopicPartition> parts = List.of(new TopicPartition(topic, 0),
                    new TopicPartition(topic, 1));
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            var end = consumer.endOffsets(parts);  // read_committed: the last stable offsets
            int count = 0;
            long deadline = System.currentTimeMillis() + 30_000;
            while (System.currentTimeMillis() < deadline) {
                boolean done = true;
                for (TopicPartition tp : parts) {
                    done &= consumer.position(tp) >= end.get(tp);
                }
                if (done) {
                    break;
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                    System.out.println("REC\t" + isolation + "\t" + r.partition() + "\t"
                            + r.offset() + "\t" + new String(r.value(), StandardCharsets.UTF_8));
                    count++;
                }
            }
            System.out.println("DONE\t" + isolation + "\t" + count);
        }
    }

    // The client completes a failed send's future (waking the caller) before its Sender thread
    // records the error (abortable error state, epoch bump required: KIP-588). An abort called
    // in between sends only EndTxn at the fenced epoch, no InitProducerId: the producer goes on
    // with that epoch and its next transaction is refused (ProducerFencedException). As Kafka's
    // own test does (KAFKA-18035), sends probe the state before the abort: in its error state
    // the client refuses a send at once, calling the callback in the caller's thread (an
    // accepted send's callback runs in the Sender thread). A probe accepted before is never
    // written (its epoch is fenced); it would show as "t-probe" to read_uncommitted.
    static void awaitErrorState(KafkaProducer<byte[], byte[]> p, String topic) throws Exception {
        Thread caller = Thread.currentThread();
        AtomicBoolean refused = new AtomicBoolean();
        long deadline = System.currentTimeMillis() + 30_000;
        while (true) {
            try {
                p.send(new ProducerRecord<>(topic, 0, null,
                        "t-probe".getBytes(StandardCharsets.UTF_8)), (metadata, e) -> {
                            if (e != null && Thread.currentThread() == caller) {
                                refused.set(true);
                            }
                        });
            } catch (KafkaException e) {
                return;  // other error states throw
            }
            if (refused.get()) {
                return;
            }
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("the producer never entered its error state");
            }
            Thread.sleep(10);
        }
    }

    static void expire(String bootstrap, String topic) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "3000");
        try (KafkaProducer<byte[], byte[]> p = producer(bootstrap, "expiring", props)) {
            p.beginTransaction();
            send(p, topic, "t", 1);
            Thread.sleep(6000);  // the coordinator aborts it and bumps the epoch
            String thrown = "none";
            try {
                send(p, topic, "t-late", 1);
                p.commitTransaction();
            } catch (Exception e) {
                Throwable cause = e.getCause() != null ? e.getCause() : e;
                thrown = cause.getClass().getName();
            }
            System.out.println("EXPIRED\t" + thrown);
            System.out.flush();
            awaitErrorState(p, topic);
            System.err.println("STEP abort");
            p.abortTransaction();
            System.err.println("STEP next transaction");
            p.beginTransaction();
            send(p, topic, "r", 1);
            p.commitTransaction();
        }
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        Properties a = new Properties();
        a.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(a)) {
            admin.createTopics(List.of(new NewTopic(topic, 2, (short) 1))).all().get();
        }
        if (args.length > 2 && args[2].equals("timeout")) {
            try {
                expire(bootstrap, topic);
            } catch (Exception e) {
                e.printStackTrace();  // here: the launcher cannot trim some traces
                System.exit(1);
            }
            read(bootstrap, topic, "read_committed");
            read(bootstrap, topic, "read_uncommitted");
            return;
        }
        try (KafkaProducer<byte[], byte[]> p = producer(bootstrap, "java-tx")) {
            p.beginTransaction();
            send(p, topic, "c", 6);
            p.commitTransaction();
            p.beginTransaction();
            send(p, topic, "a", 4);
            p.abortTransaction();
            p.beginTransaction();
            send(p, topic, "d", 2);
            p.commitTransaction();
        }
        KafkaProducer<byte[], byte[]> zombie = producer(bootstrap, "zombie");
        zombie.beginTransaction();
        send(zombie, topic, "z", 2);
        try (KafkaProducer<byte[], byte[]> fresh = producer(bootstrap, "zombie")) {
            try {
                zombie.commitTransaction();
                System.out.println("FENCED\tnone");
            } catch (Exception e) {
                System.out.println("FENCED\t" + e.getClass().getName());
            }
            fresh.beginTransaction();
            send(fresh, topic, "f", 1);
            fresh.commitTransaction();
        }
        zombie.close(Duration.ofSeconds(5));
        read(bootstrap, topic, "read_committed");
        read(bootstrap, topic, "read_uncommitted");
    }
}
