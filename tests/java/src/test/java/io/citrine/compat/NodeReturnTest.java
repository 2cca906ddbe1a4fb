/*
 * The node NodeLossTest killed comes back, empty (its namespaces are in
 * memory), while the official Java client keeps writing and reading the
 * records NodeLossTest left: the rolling-restart case. Every read must
 * see the latest acknowledged write, before, during and after the
 * migrations that refill the returning node, and the client must see the
 * node again. Runs only when scripts/java-client-suite.sh sets
 * CITRINE_NODE_RETURNS to a file's path: the test creates the file when it
 * starts reading, and the script relaunches the node a second later.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.Bin;
import com.aerospike.client.Info;
import com.aerospike.client.Key;
import com.aerospike.client.Record;
import com.aerospike.client.cluster.Node;
import com.aerospike.client.policy.Policy;
import com.aerospike.client.policy.WritePolicy;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.Test;

class NodeReturnTest extends CompatBase {

    /** NodeLossTest's set: its records are the ones read here. */
    @BeforeEach
    void useNodeLossSet(TestInfo info) {
        set = "jNodeLossTest_killedNodeLosesNoAcknowledgedWrite";
    }

    /** Partitions still migrating on any node the client knows. */
    private static long migrationsLeft() {
        long left = 0;
        for (Node node : client.getNodes()) {
            String stats = Info.request(null, node, "statistics");
            left += Long.parseLong(stat(stats, "migrate_partitions_remaining"));
        }
        return left;
    }

    @Test
    void returningNodeServesTheLatestWrites() throws IOException {
        String signal = System.getenv("CITRINE_NODE_RETURNS");
        Assumptions.assumeTrue(signal != null && !signal.isEmpty(),
            "needs scripts/java-client-suite.sh NODES>=2 (it relaunches the node NodeLossTest killed)");
        int n = 600;
        WritePolicy wp = patient(new WritePolicy());
        Policy rp = patient(new Policy());
        assertEquals(nodes() - 1, client.getNodes().length, "the killed node is still away");
        // Tell the script to bring the node back now that reads are about
        // to start.
        Files.writeString(Path.of(signal), "reading\n");

        long deadline = System.currentTimeMillis() + 90000;
        boolean back = false;
        int passesAfter = 0;
        int pass = 0;
        List<String> wrong = new ArrayList<>();
        while (passesAfter < 2) {
            assertTrue(System.currentTimeMillis() < deadline,
                "the node did not come back with migrations done within 90 s (pass " + pass + ")");
            pass++;
            for (int i = 0; i < n; i++) {
                Key k = key(i);
                if (i % 3 == pass % 3) {
                    client.put(wp, k, new Bin("w", pass));
                }
                Record r = client.get(rp, k);
                int expectedW = lastWrite(i, pass);
                if (r == null || r.getValue("v") == null || r.getInt("v") != i
                        || r.getValue("w") == null || r.getInt("w") != expectedW) {
                    wrong.add("pass " + pass + " key " + i + ": " + r + " (w should be " + expectedW + ")");
                }
            }
            assertEquals(List.of(), wrong, "reads that missed an acknowledged write");
            if (!back && client.getNodes().length == nodes() && migrationsLeft() == 0) {
                back = true;
            } else if (back) {
                passesAfter++;
            }
        }
        assertEquals(nodes(), client.getNodes().length);
        assertTrue(pass >= 3, "passes " + pass);
        // The returned node (the one started last) answered some of the
        // reads: the passes did go through it, not only around it.
        Node youngest = null;
        long youngestUptime = Long.MAX_VALUE;
        for (Node node : client.getNodes()) {
            long uptime = Long.parseLong(stat(Info.request(null, node, "statistics"), "uptime"));
            if (uptime < youngestUptime) {
                youngestUptime = uptime;
                youngest = node;
            }
        }
        long reads = Long.parseLong(stat(Info.request(null, youngest, "namespace/test"), "client_read_success"));
        assertTrue(reads > 0, "the returned node " + youngest + " answered no read");
    }

    /** The w bin of key i after pass `pass` wrote its third of the keys
     * (before any pass: NodeLossTest's i * 2). */
    private static int lastWrite(int i, int pass) {
        for (int p = pass; p >= 1; p--) {
            if (i % 3 == p % 3) {
                return p;
            }
        }
        return i * 2;
    }
}
