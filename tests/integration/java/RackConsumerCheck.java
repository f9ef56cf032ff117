// Fetch from the closest replica (KIP-392) with the official Apache Kafka Java consumer against
// floe brokers in racks.
//
// Single-file program: `java -cp 'lib/*' RackConsumerCheck.java BOOTSTRAP TOPIC PARTITIONS
// RACK COUNT`. A consumer with client.rack=RACK (no group) is assigned every partition of
// TOPIC from offset 0 and polls until it has COUNT records (30 s at most).
// Output (stdout, tab-separated): one line per record, `R PARTITION OFFSET VALUE`, then
// `DONE COUNT`. Any unexpected exception: stack trace, exit status 1.

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

public class RackConsumerCheck {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], rack = args[3];
        int partitions = Integer.parseInt(args[2]);
        int count = Integer.parseInt(args[4]);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.CLIENT_RACK_CONFIG, rack);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG,
                  StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int p = 0; p < partitions; p++) {
                tps.add(new TopicPartition(topic, p));
            }
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            int got = 0;
            long deadline = System.currentTimeMillis() + 30_000;
            StringBuilder out = new StringBuilder();
            while (got < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    out.append("R\t").append(r.partition()).append('\t').append(r.offset())
                       .append('\t').append(r.value()).append('\n');
                    got++;
                }
            }
            System.out.print(out);
            System.out.println("DONE\t" + got);
        }
    }
}
