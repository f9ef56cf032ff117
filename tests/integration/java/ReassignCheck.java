// Partition reassignment with the official Apache Kafka Java Admin client against floe brokers.
//
// Single-file program: `java -cp 'lib/*' ReassignCheck.java BOOTSTRAP TOPIC TARGET OTHER`.
// Partition 0 of TOPIC (created beforehand) is reassigned to broker TARGET, the program waits
// (20 s at most) until Metadata names TARGET its leader, lists the ongoing reassignments, then
// tries the refusals (broker 99, two brokers [TARGET, OTHER]), cancels the pin and cancels it
// again.
// Output (stdout, tab-separated):
//   ALTER ok
//   LEADER NODE_ID SECONDS            once the leader is TARGET
//   LISTED COUNT                      ongoing reassignments after that
//   BOGUS EXCEPTION_CLASS             the reassignment to broker 99
//   MULTI EXCEPTION_CLASS             the reassignment to two brokers
//   CANCEL ok
//   CANCEL_AGAIN EXCEPTION_CLASS
// Any unexpected exception: stack trace, exit status 1.

import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.PartitionReassignment;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartition;

public class ReassignCheck {
    static String refusal(Admin admin, TopicPartition tp, Optional<NewPartitionReassignment> r)
            throws InterruptedException {
        try {
            admin.alterPartitionReassignments(Map.of(tp, r)).all().get();
            return "none";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getName();
        }
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int target = Integer.parseInt(args[2]);
        int other = Integer.parseInt(args[3]);
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(p)) {
            TopicPartition tp = new TopicPartition(topic, 0);
            admin.alterPartitionReassignments(Map.of(tp, Optional.of(
                new NewPartitionReassignment(List.of(target))))).all().get();
            System.out.println("ALTER\tok");
            long began = System.nanoTime();
            int leader = -1;
            while (System.nanoTime() - began < 20_000_000_000L) {
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get()
                    .get(topic);
                leader = d.partitions().get(0).leader() == null ? -1
                    : d.partitions().get(0).leader().id();
                if (leader == target) {
                    break;
                }
                Thread.sleep(100);
            }
            System.out.printf("LEADER\t%d\t%.2f%n", leader, (System.nanoTime() - began) / 1e9);
            Map<TopicPartition, PartitionReassignment> listed =
                admin.listPartitionReassignments().reassignments().get();
            System.out.println("LISTED\t" + listed.size());
            System.out.println("BOGUS\t" + refusal(admin, tp, Optional.of(
                new NewPartitionReassignment(List.of(99)))));
            System.out.println("MULTI\t" + refusal(admin, tp, Optional.of(
                new NewPartitionReassignment(List.of(target, other)))));
            admin.alterPartitionReassignments(Map.of(tp, Optional.empty())).all().get();
            System.out.println("CANCEL\tok");
            System.out.println("CANCEL_AGAIN\t" + refusal(admin, tp, Optional.empty()));
        }
    }
}
