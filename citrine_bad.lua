function f(rec)
  asdf
  returned ret
end
