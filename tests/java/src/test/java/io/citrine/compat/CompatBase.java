/*
 * Shared set-up of the Java compatibility suite: one official
 * AerospikeClient per test class, connected to the citrined that
 * scripts/java-client-suite.sh started (CITRINE_HOST, CITRINE_PORT), and a
 * set name of its own for every test, so that tests never see each other's
 * records.
 */
package io.citrine.compat;

import com.aerospike.client.AerospikeClient;
import com.aerospike.client.Key;
import com.aerospike.client.policy.ClientPolicy;
import com.aerospike.client.policy.Policy;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.TestInfo;

abstract class CompatBase {
    static final String NS = "test";
    static AerospikeClient client;

    /** This test's own set name: the test class and method. */
    String set;

    static String host() {
        String h = System.getenv("CITRINE_HOST");
        return h == null || h.isEmpty() ? "127.0.0.1" : h;
    }

    static int port() {
        String p = System.getenv("CITRINE_PORT");
        if (p == null || p.isEmpty()) {
            throw new IllegalStateException(
                "CITRINE_PORT is not set: run scripts/java-client-suite.sh, which starts citrined");
        }
        return Integer.parseInt(p);
    }

    /** How many nodes the script started (CITRINE_NODES, default 1). */
    static int nodes() {
        String n = System.getenv("CITRINE_NODES");
        return n == null || n.isEmpty() ? 1 : Integer.parseInt(n);
    }

    static ClientPolicy clientPolicy() {
        ClientPolicy policy = new ClientPolicy();
        policy.timeout = 5000;
        policy.failIfNotConnected = true;
        return policy;
    }

    /** A policy that rides out a node's death or return: up to 10 s, 20
     * retries 100 ms apart, each try given 1 s. */
    static <P extends Policy> P patient(P policy) {
        policy.totalTimeout = 10000;
        policy.socketTimeout = 1000;
        policy.maxRetries = 20;
        policy.sleepBetweenRetries = 100;
        return policy;
    }

    /** A list of integers, sorted: for results whose order the server may
     * choose (the values of a rank range of an unordered list come in the
     * reference's heap order). */
    @SuppressWarnings("unchecked")
    static List<Long> sorted(Object list) {
        List<Long> out = new ArrayList<>((List<Long>) list);
        out.sort(null);
        return out;
    }

    /** The value of `name` in an info answer of `name=value;...` pairs. */
    static String stat(String stats, String name) {
        for (String field : stats.split(";")) {
            if (field.startsWith(name + "=")) {
                return field.substring(name.length() + 1);
            }
        }
        throw new AssertionError(name + " not in " + stats);
    }

    @BeforeAll
    static void connect() {
        client = new AerospikeClient(clientPolicy(), host(), port());
    }

    @AfterAll
    static void disconnect() {
        if (client != null) {
            client.close();
            client = null;
        }
    }

    @BeforeEach
    void nameSet(TestInfo info) {
        String cls = getClass().getSimpleName();
        String method = info.getTestMethod().map(m -> m.getName()).orElse("t");
        // Set names are limited to 63 bytes.
        String name = ("j" + cls + "_" + method);
        set = name.length() > 63 ? name.substring(0, 63) : name;
    }

    Key key(Object userKey) {
        if (userKey instanceof Integer i) {
            return new Key(NS, set, i.longValue());
        }
        if (userKey instanceof Long l) {
            return new Key(NS, set, l);
        }
        if (userKey instanceof byte[] b) {
            return new Key(NS, set, b);
        }
        return new Key(NS, set, userKey.toString());
    }
}
