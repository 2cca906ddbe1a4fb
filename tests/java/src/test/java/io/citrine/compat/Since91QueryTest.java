/*
 * Queries the Java client gained in 9.1 (server 8.1): an index over an
 * expression's value, and queries that name the index instead of the
 * bin. scripts/java-client-suite.sh leaves this class out when
 * JAVA_CLIENT_VERSION is older (8.x, 9.0.x), which has neither.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.exp.Exp;
import com.aerospike.client.query.Filter;
import com.aerospike.client.query.IndexCollectionType;
import com.aerospike.client.query.IndexType;
import com.aerospike.client.query.Statement;
import org.junit.jupiter.api.Test;

class Since91QueryTest extends QueryBase {

    @Test
    void queryByIndexName() {
        writeRecords(100);
        String num = "jq_name_" + Long.toHexString(System.nanoTime());
        client.createIndex(null, NS, set, num, "i", IndexType.NUMERIC).waitTillComplete();
        try {
            Statement byName = statement();
            byName.setFilter(Filter.rangeByIndex(num, 95, 1000));
            assertEquals(range(95, 100, 1), values(client.query(null, byName), "i"));
        } finally {
            client.dropIndex(null, NS, set, num).waitTillComplete();
        }
    }

    @Test
    void expressionIndex() {
        writeRecords(50);
        String name = "jq_exp_" + Long.toHexString(System.nanoTime());
        Exp doubled = Exp.mul(Exp.intBin("i"), Exp.val(2));
        client.createIndex(null, NS, set, name, IndexType.NUMERIC, IndexCollectionType.DEFAULT,
            Exp.build(doubled)).waitTillComplete();
        try {
            Statement stmt = statement();
            stmt.setFilter(Filter.range(Exp.build(doubled), 10, 20));
            assertEquals(range(5, 11, 1), values(client.query(null, stmt), "i"));
            Statement byName = statement();
            byName.setFilter(Filter.rangeByIndex(name, 90, 200));
            assertEquals(range(45, 50, 1), values(client.query(null, byName), "i"));
        } finally {
            client.dropIndex(null, NS, set, name).waitTillComplete();
        }
    }
}
