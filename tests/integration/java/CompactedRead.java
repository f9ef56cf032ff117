// Reads partition 0 of a topic from offset 0 to its end offset with the official Java client and
// prints every record: `REC OFFSET KEY VALUE TIMESTAMP` (KEY/VALUE base64, "-" for null), then
// `END POSITION`. Usage: java -cp 'lib/*' CompactedRead.java BOOTSTRAP TOPIC

import java.time.Duration;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class CompactedRead {
    static String b64(byte[] b) {
        return b == null ? "-" : Base64.getEncoder().encodeToString(b);
    }

    public static void main(String[] args) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        TopicPartition tp = new TopicPartition(args[1], 0);
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            c.assign(List.of(tp));
            c.seek(tp, 0);
            Map<TopicPartition, Long> ends = c.endOffsets(List.of(tp), Duration.ofSeconds(30));
            long end = ends.get(tp);
            long deadline = System.currentTimeMillis() + 60_000;
            while (c.position(tp) < end && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    System.out.println("REC\t" + r.offset() + "\t" + b64(r.key()) + "\t"
                            + b64(r.value()) + "\t" + r.timestamp());
                }
            }
            System.out.println("END\t" + c.position(tp));
        }
    }
}
