
function test_func(rec, div)
   local ret = map()
   local x = rec['bin1']
   rec['bin2'] = math.floor(x / div)
   aerospike:update(rec)
   ret['status'] = 'OK'
   return ret
end

function echo(rec, param) return param end

function create(rec, bins)
   for b, v in map.pairs(bins) do rec[b] = v end
   return aerospike:create(rec)
end

function remove(rec) aerospike:remove(rec) end

function meta(rec)
   return list{record.gen(rec), aerospike:exists(rec), record.setname(rec)}
end

function no_update(rec) rec['bin1'] = 999; return 1 end

function with_ttl(rec, ttl) rec['t'] = 1; record.set_ttl(rec, ttl); aerospike:update(rec) end

function fail(rec) error("1000:Invalid value") end

function forever(rec) while true do end end
