function setbin(rec, v)
  rec['a'] = v
  if aerospike:exists(rec) then aerospike:update(rec) else aerospike:create(rec) end
  return 1
end
