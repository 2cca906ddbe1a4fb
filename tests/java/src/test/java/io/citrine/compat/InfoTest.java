/*
 * What the official Java client learns from the info protocol: one node,
 * its name and build, the namespace list and a namespace's configuration,
 * the partition map the client built (every partition of `test` owned by
 * that node), and the connection statistics it keeps.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.Info;
import com.aerospike.client.cluster.ClusterStats;
import com.aerospike.client.cluster.Node;
import com.aerospike.client.cluster.Partitions;
import java.util.Map;
import org.junit.jupiter.api.Test;

class InfoTest extends CompatBase {

    @Test
    void everyNodeWithItsNameAndBuild() {
        Node[] nodes = client.getNodes();
        assertEquals(nodes(), nodes.length, "the client found every node");
        for (Node node : nodes) {
            checkNode(node);
        }
    }

    private void checkNode(Node node) {
        assertTrue(node.isActive());
        Map<String, String> answers = Info.request(null, node, "node", "build", "namespaces", "statistics");
        assertEquals(node.getName(), answers.get("node"));
        assertTrue(answers.get("build").matches("\\d+\\.\\d+\\.\\d+.*"), answers.get("build"));
        assertTrue(answers.get("namespaces").contains("test"), answers.get("namespaces"));
        assertFalse(answers.get("statistics").isEmpty());
        String ns = Info.request(null, node, "namespace/test");
        assertTrue(ns.contains("replication-factor="), ns);
    }

    @Test
    void everyPartitionHasAMasterAndItsReplicas() {
        Partitions partitions = client.getCluster().partitionMap.get(NS);
        assertNotNull(partitions, "the client has a partition map for test");
        assertFalse(partitions.scMode);
        int copies = Math.min(nodes(), 2);
        assertEquals(copies, partitions.replicas.length, "replicas per partition");
        java.util.Map<Node, Integer> masters = new java.util.HashMap<>();
        for (int p = 0; p < 4096; p++) {
            Node master = partitions.replicas[0].get(p);
            assertNotNull(master, "master of partition " + p);
            masters.merge(master, 1, Integer::sum);
            if (copies > 1) {
                Node replica = partitions.replicas[1].get(p);
                assertNotNull(replica, "replica of partition " + p);
                assertNotSame(master, replica, "partition " + p);
            }
        }
        assertEquals(nodes(), masters.size(), "every node masters partitions: " + masters.values());
        for (int count : masters.values()) {
            // Balanced: no node far from its share.
            assertTrue(Math.abs(count - 4096 / nodes()) < 4096 / nodes() / 5, "masters " + masters.values());
        }
    }

    @Test
    void racksListEveryNodeOfTheView() {
        // The suite's nodes all run in rack 0: `racks:` names each of them
        // there, by node id, and so does every node.
        String[] names = java.util.Arrays.stream(client.getNodes()).map(Node::getName)
            .sorted((a, b) -> Long.compareUnsigned(
                Long.parseUnsignedLong(a, 16), Long.parseUnsignedLong(b, 16)))
            .toArray(String[]::new);
        String expected = "ns=" + NS + ":rack_0=" + String.join(",", names);
        for (Node node : client.getNodes()) {
            String answer = Info.request(null, node, "racks:namespace=" + NS);
            assertEquals(expected, answer, "racks: from " + node.getName());
        }
    }

    @Test
    void unknownInfoCommandDoesNotBreakTheConnection() {
        Node node = client.getNodes()[0];
        Map<String, String> answers = Info.request(null, node, "no-such-command", "build");
        assertNotNull(answers.get("build"));
        assertTrue(client.isConnected());
    }

    @Test
    void clusterStatsCountConnections() {
        client.put(null, key("stats"), new com.aerospike.client.Bin("v", 1));
        ClusterStats stats = client.getClusterStats();
        assertEquals(nodes(), stats.nodes.length);
        int connections = 0;
        for (var node : stats.nodes) {
            connections += node.sync.inUse + node.sync.inPool;
        }
        assertTrue(connections >= 1);
    }
}
